// Opens zkgate's dashboard in Debian's chromium and checks that it follows contention and queue
// traffic live: the holder, the number of waiters and the queue depth change on the page,
// without a reload, as HTTP clients act; that semaphores and a finished double barrier show as
// they are, that the filter applies to every section, and that a 420 px wide screen scrolls
// tables instead of cutting them. Saves a screenshot.
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
  // A lease is labelled by its own part (the instance part before the dash is the same for all).
  const label = (id) => "lease " + id.split("-")[1].slice(0, 8);
  const row = '#locks tr[data-name="orders"]';
  await until(`${row} td.holder`, label(leases[0]));
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
  const queueRow = '#queues tr[data-name="jobs"]';
  await until(`${queueRow} td.depth`, "3");
  const taken = await api("POST", "/v1/queues/jobs/take?wait=0&ack_deadline=60s");
  expect(taken.status === 200, "take: " + taken.status);
  await until(`${queueRow} td.depth`, "2");
  // A delayed item says when it comes due.
  expect((await api("POST", "/v1/queues/later/items?delay=10m", { n: 1 })).status === 201, "delayed put");
  await page.waitForFunction(() => /next due in \d+ min/.test(document.querySelector('#queues tr[data-name="later"] td.depth')?.textContent || ""), null, { timeout: 15000 })
    .catch(() => { throw new Error("the delayed item's due time is not shown"); });

  // The holder releases: the next waiter holds, one waits.
  const released = await api("DELETE", `/v1/locks/orders/handles/${held.json.handle}`);
  expect(released.status === 204, "release: " + released.status);
  await until(`${row} td.holder`, label(leases[1]));
  await until(`${row} td.waiters`, "1");
  // The section's head counts from the server's summary.
  await until("#locks-section h2 .count", "1 · 1 contended · 1 waiting");

  // A semaphore with two of three permits held.
  for (let i = 0; i < 2; i++) {
    const permit = await api("POST", "/v1/semaphores/exports/acquire?permits=3&wait=0", { lease: leases[i] });
    expect(permit.status === 200, "permit: " + permit.status);
  }
  await until('#semaphores tr[data-name="exports"] td.held', "2");
  // A double barrier whose round is over says so.
  const entered = await api("POST", "/v1/double-barriers/batch/enter?wait=5s", { participant: "a", size: 1 });
  expect(entered.status === 200, "enter: " + entered.status);
  await page.waitForFunction(() => /all in/.test(document.querySelector('#double-barriers tr[data-name="batch"]')?.textContent || ""), null, { timeout: 15000 });
  const left = await api("POST", "/v1/double-barriers/batch/leave?wait=5s", { participant: "a" });
  expect(left.status === 200, "leave: " + left.status);
  await until('#double-barriers tr[data-name="batch"] td:nth-child(2)', "finished");
  // A counter, its value shown live as it moves.
  const counterRow = '#counters tr[data-name="shipped"]';
  expect((await api("POST", "/v1/counters/shipped/add", { delta: 1200 })).status === 200, "add");
  await until(`${counterRow} td:nth-child(2)`, "1,200");
  expect((await api("POST", "/v1/counters/shipped/add", { delta: -1 })).status === 200, "add");
  await until(`${counterRow} td:nth-child(2)`, "1,199");
  await until(`${counterRow} td:nth-child(3)`, "1");
  // A service with one instance, shown where it listens.
  const registered = await api("PUT", "/v1/services/billing/instances/b1", { address: "10.0.0.5", port: 8080, lease: leases[0] });
  expect(registered.status === 201, "register: " + registered.status);
  await until('#services tr[data-name="billing"] td.instances', "1");
  await until('#services tr[data-name="billing"] td:nth-child(3)', "10.0.0.5:8080");
  // A key bound to a lease, shown under the lease.
  const bound = await fetch(`${base}/v1/kv/workers/w1?lease=${leases[1]}`, { method: "PUT", body: "10.0.0.9", headers: { "content-type": "text/plain" } });
  expect(bound.status === 201, "bind a key: " + bound.status);
  await until(`#leases tr[data-name="${leases[1]}"] td:nth-child(5)`, "workers/w1");

  // One filter for every section: "ord" keeps the lock and hides the queue, the semaphore,
  // the double barrier, the counter, the service and every lease.
  await page.fill("#filter", "ord");
  await until('#locks tr[data-name="orders"] td.name', "orders");
  for (const kind of ["queues", "semaphores", "double-barriers", "counters", "services", "leases"]) {
    await page.waitForFunction((k) => document.querySelectorAll(`#${k} tr[data-name]`).length === 0, kind, { timeout: 15000 })
      .catch(() => { throw new Error(`the filter left rows in ${kind}`); });
  }
  await page.fill("#filter", "");
  await until(`${queueRow} td.depth`, "2");

  // Let the charts gather a few samples, then keep the picture.
  await page.waitForFunction(() => document.querySelectorAll("#contention-chart polyline").length === 5, null, { timeout: 15000 });
  await page.waitForFunction(() => window.zkgate.sections.locks.rows.get("orders").history.length >= 5, null, { timeout: 15000 });
  expect(await page.evaluate(() => window.__noReload === true), "the page was reloaded");
  expect(foreign.length === 0, "the page loaded from elsewhere: " + foreign.join(", "));
  await page.screenshot({ path: screenshot, fullPage: true });
  // A lock whose holder's lease expired, held for the lease's lock-delay: the holder shows it.
  const short = await api("POST", "/v1/leases", { ttl: "1s", lock_delay: "20s" });
  expect(short.status === 201, "a lease with a lock-delay: " + short.status);
  const ledger = await api("POST", "/v1/locks/ledger/acquire?wait=0", { lease: short.json.id });
  expect(ledger.status === 200, "ledger: " + ledger.status);
  await page.waitForFunction(() => {
    const cell = document.querySelector('#locks tr[data-name="ledger"] td.holder');
    return cell && cell.textContent.includes("ended, held until");
  }, null, { timeout: 15000 }).catch(() => { throw new Error("the delayed lock's holder never said it is held by an ended lease"); });

  // The icon browsers ask for is there.
  const icon = await fetch(base + "/favicon.ico");
  expect(icon.status === 200 && icon.headers.get("content-type") === "image/x-icon", "favicon: " + icon.status);
  // On a 420 px screen nothing is cut off: the page does not scroll sideways (wide tables
  // scroll inside their section), and every section is as wide as the screen allows.
  await page.setViewportSize({ width: 420, height: 900 });
  await page.waitForFunction(() => document.documentElement.scrollWidth <= 420, null, { timeout: 15000 })
    .catch(async () => { throw new Error("at 420 px the page is " + await page.evaluate(() => document.documentElement.scrollWidth) + " px wide"); });
  const cut = await page.evaluate(() => [...document.querySelectorAll("section")].filter((s) => s.getBoundingClientRect().right > 420).map((s) => s.id));
  expect(cut.length === 0, "sections past the screen's edge: " + cut.join(", "));
  await page.screenshot({ path: screenshot.replace(/\.png$/, "-narrow.png"), fullPage: false });
  console.log("dashboard followed the traffic live; screenshot:", screenshot, "holder:", await text(`${row} td.holder`));
} finally {
  await browser.close();
}
