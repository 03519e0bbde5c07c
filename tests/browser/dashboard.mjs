// Opens zkgate's dashboard in Debian's chromium and checks that it follows contention and queue
// traffic live: the holder, the number of waiters and the queue depth change on the page,
// without a reload, as HTTP clients act. Saves a screenshot.
//
//   node tests/browser/dashboard.mjs http://127.0.0.1:PORT screenshot.png
import { chromium } from "playwright-core";
import { client } from "./api.mjs";

const [base, screenshot] = process.argv.slice(2);
if (!base || !screenshot) {
  console.error("usage: dashboard.mjs BASE_URL SCREENSHOT.png");
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";

const api = client(base);

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage({ viewport: { width: 1440, height: 1000 } });
  page.on("pageerror", (e) => { console.error("page error:", e.message); process.exitCode = 1; });
  // Everything the page loads comes from zkgate itself.
  const foreign = [];
  page.on("request", (r) => { const u = new URL(r.url()); if (u.host !== new URL(base).host) foreign.push(r.url()); });
  await page.goto(base + "/");
  await page.waitForSelector("#live.ok", { timeout: 15000 });
  // A reload would lose this mark: everything after must arrive live.
  await page.evaluate(() => { window.__noReload = true; });
  const text = (selector) => page.locator(selector).innerText({ timeout: 15000 });
  const until = async (selector, wanted) => {
    await page.waitForFunction(([s, w]) => {
      const e = document.querySelector(s);
      return e && e.textContent.trim() === w;
    }, [selector, wanted], { timeout: 15000 }).catch(async () => {
      throw new Error(`${selector} never showed "${wanted}" (shows "${await page.locator(selector).textContent().catch(() => "nothing")}")`);
    });
  };

  // Contention: one holder, two waiters.
  const leases = [];
  for (let i = 0; i < 3; i++) {
    const lease = await api("POST", "/v1/leases", { ttl: "60s" });
    expect(lease.status === 201, "lease: " + lease.status);
    leases.push(lease.json.id);
  }
  const held = await api("POST", "/v1/locks/orders/acquire?wait=0", { lease: leases[0] });
  expect(held.status === 200, "acquire: " + held.status);
  const row = 'tr[data-lock="orders"]';
  await until(`${row} td.holder`, "lease " + leases[0].slice(0, 8));
  await until(`${row} td.waiters`, "0");
  for (const lease of leases.slice(1)) {
    const queued = await api("POST", "/v1/locks/orders/acquire?wait=0&keep_queued=true", { lease });
    expect(queued.status === 202, "queued: " + queued.status);
  }
  await until(`${row} td.waiters`, "2");
  await until("#detail-name", "orders");
  expect((await page.locator("#detail-queue tr").count()) === 2, "the queue lists both waiters");

  // Queue traffic: three puts, one take.
  for (let n = 0; n < 3; n++) {
    expect((await api("POST", "/v1/queues/jobs/items", { n })).status === 201, "put");
  }
  const queueRow = 'tr[data-queue="jobs"]';
  await until(`${queueRow} td.depth`, "3");
  const taken = await api("POST", "/v1/queues/jobs/take?wait=0&ack_deadline=60s");
  expect(taken.status === 200, "take: " + taken.status);
  await until(`${queueRow} td.depth`, "2");

  // The holder releases: the next waiter holds, one waits.
  const released = await api("DELETE", `/v1/locks/orders/handles/${held.json.handle}`);
  expect(released.status === 204, "release: " + released.status);
  await until(`${row} td.holder`, "lease " + leases[1].slice(0, 8));
  await until(`${row} td.waiters`, "1");

  // Let the charts gather a few samples, then keep the picture.
  await page.waitForFunction(() => document.querySelectorAll("#contention-chart polyline").length === 2, null, { timeout: 15000 });
  await page.waitForFunction(() => kinds.locks.items.get("orders").history.length >= 5, null, { timeout: 15000 });
  expect(await page.evaluate(() => window.__noReload === true), "the page was reloaded");
  expect(foreign.length === 0, "the page loaded from elsewhere: " + foreign.join(", "));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log("dashboard followed the traffic live; screenshot:", screenshot, "holder:", await text(`${row} td.holder`));
} finally {
  await browser.close();
}
