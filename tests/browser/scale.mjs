// The dashboard at scale, in Debian's chromium: with thousands of locks and queues already in
// ZooKeeper, the page shows their counts and the busiest rows soon after it opens, follows only
// the rows on screen, pages and filters every name, and holds a bounded number of
// subscriptions, DOM nodes and heap, while zkgate and ZooKeeper hold a bounded number of topics
// and watches. Prints how long the page took to be usable (BENCHMARKS.md quotes it).
//
//   node tests/browser/scale.mjs http://127.0.0.1:PORT ZOOKEEPER_PORT LOCKS QUEUES [screenshot.png]
import net from "node:net";
import { chromium } from "playwright-core";
import { client } from "./api.mjs";

const [base, zkPort, locksArg, queuesArg, screenshot] = process.argv.slice(2);
if (!base || !zkPort || !locksArg || !queuesArg) {
  console.error("usage: scale.mjs BASE_URL ZOOKEEPER_PORT LOCKS QUEUES [SCREENSHOT.png]");
  process.exit(2);
}
const [locks, queues] = [Number(locksArg), Number(queuesArg)];
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const api = client(base);
const fmt = (n) => n.toLocaleString("en-US");

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

// A figure of ZooKeeper's `mntr` four-letter word.
function mntr(figure) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(zkPort), "127.0.0.1", () => socket.write("mntr"));
    let text = "";
    socket.on("data", (d) => { text += d; });
    socket.on("end", () => {
      const line = text.split("\n").find((l) => l.split(/\s/)[0] === figure);
      line ? resolve(Number(line.split(/\s+/)[1])) : reject(new Error(figure + " not in mntr"));
    });
    socket.on("error", reject);
  });
}

// A gauge of zkgate's /metrics.
async function gauge(name) {
  const text = await (await fetch(base + "/metrics")).text();
  const line = text.split("\n").find((l) => l.startsWith(name + " "));
  return Number(line.split(" ")[1]);
}

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.on("pageerror", (e) => { console.error("page error:", e.message); process.exitCode = 1; });
  const cdp = await page.context().newCDPSession(page);
  await cdp.send("Performance.enable");
  const metrics = async () => Object.fromEntries((await cdp.send("Performance.getMetrics")).metrics.map((m) => [m.name, m.value]));

  // Usable: both counts are shown, the busiest lock's row has its holder, the busiest queue's
  // row its depth.
  const opened = Date.now();
  await page.goto(base + "/");
  await page.waitForFunction(([l, q]) => {
    const count = (kind) => document.querySelector(`#${kind}-section h2 .count`)?.textContent || "";
    const firstLock = document.querySelector("#locks tr[data-name] td.holder")?.textContent || "";
    const firstQueue = document.querySelector("#queues tr[data-name] td.depth")?.textContent || "";
    // The lock's holder comes from its own topic (its node: these locks' holders are peers).
    return count("locks").startsWith(l + " ") && count("queues").startsWith(q + " ")
      && firstLock.startsWith("_c_") && /\d/.test(firstQueue);
  }, [fmt(locks), fmt(queues)], { timeout: 30000 }).catch(async () => {
    throw new Error("the page was not usable within 30 s: " + await page.locator("#locks-section h2").textContent());
  });
  const usable = Date.now() - opened;
  const first = await page.locator("#locks tr[data-name]").first().getAttribute("data-name");

  // The busiest first: the most contended lock heads the table.
  expect(first === "lock-00007", "the busiest lock first, not " + first);
  const rows = await page.locator("#locks tr[data-name]").count();
  expect(rows === 20 || rows === 25, "a page of rows, not " + rows);

  // Browse every lock, page by page; then filter.
  await page.locator("#locks-section .pager button", { hasText: "browse all" }).click();
  await page.waitForFunction(() => document.querySelector("#locks tr[data-name]")?.dataset.name === "lock-00000", null, { timeout: 15000 });
  await page.locator("#locks-section .pager button", { hasText: "›" }).click();
  await page.waitForFunction(() => document.querySelector("#locks tr[data-name]")?.dataset.name === "lock-00020", null, { timeout: 15000 });
  const range = await page.locator("#locks-section .pager span").textContent();
  expect(range === `21–40 of ${fmt(locks)}`, "the pager says " + range);
  await page.fill("#filter", "lock-0999");
  await page.waitForFunction(() => [...document.querySelectorAll("#locks tr[data-name]")].map((r) => r.dataset.name).join() ===
    Array.from({ length: 10 }, (_, i) => "lock-0999" + i).join(), null, { timeout: 15000 });
  await page.waitForFunction(() => document.querySelectorAll("#queues tr[data-name]").length === 0, null, { timeout: 15000 });
  await page.fill("#filter", "");
  await page.locator("#locks-section .pager button", { hasText: "busiest" }).click();
  await page.waitForFunction(() => document.querySelector("#locks tr[data-name]")?.dataset.name === "lock-00007", null, { timeout: 15000 });

  // Traffic on the busiest: the page keeps up, and what it holds stays bounded.
  for (let i = 0; i < 20; i++) {
    expect((await api("POST", "/v1/queues/queue-0003/items", { i })).status === 201, "put");
  }
  await page.waitForFunction(() => /^2\d$/.test(document.querySelector('#queues tr[data-name="queue-0003"] td.depth')?.textContent || ""), null, { timeout: 15000 });
  const subscriptions = await page.evaluate(() => window.zkgate.subscriptions());
  // What the page holds, not what it has yet to collect (each redraw replaces its rows).
  await cdp.send("HeapProfiler.collectGarbage");
  const m = await metrics();
  const heapMb = m.JSHeapUsedSize / 1048576;
  const topics = await gauge("zkgate_event_topics");
  const watches = await mntr("zk_watch_count");
  console.log(`usable after ${usable} ms with ${fmt(locks)} locks and ${fmt(queues)} queues; ` +
    `${subscriptions} subscriptions, ${m.Nodes} DOM nodes, ${heapMb.toFixed(1)} MB JS heap; ` +
    `zkgate: ${topics} topics; ZooKeeper: ${watches} watches`);
  // Per kind a summary and at most a page of rows (20 for each of nine kinds, and some
  // lingering): far below one per resource.
  expect(subscriptions <= 9 + 9 * 25, "the page follows " + subscriptions + " topics");
  expect(m.Nodes < 10000, "the page holds " + m.Nodes + " DOM nodes");
  expect(heapMb < 64, "the page's heap is " + heapMb.toFixed(1) + " MB");
  expect(topics <= 9 + 9 * 25 + 40, "zkgate follows " + topics + " topics");
  expect(watches < 2000, "ZooKeeper holds " + watches + " watches for " + fmt(locks + queues) + " resources");
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  console.log(JSON.stringify({ usable_ms: usable, subscriptions, dom_nodes: m.Nodes, heap_mb: Number(heapMb.toFixed(1)), topics, watches }));
} finally {
  await browser.close();
}
