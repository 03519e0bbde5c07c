// Puts zkgate under a realistic load for a while and takes a screenshot of its dashboard, for
// the README. Not a test: scripts/screenshot.sh runs it against a fresh zkgate.
//
//   node tests/browser/showcase.mjs http://127.0.0.1:PORT docs/dashboard.png [seconds]
import { chromium } from "playwright-core";
import { client } from "./api.mjs";

const [base, screenshot, secondsArg] = process.argv.slice(2);
const seconds = Number(secondsArg || 40);
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const random = (lo, hi) => lo + Math.random() * (hi - lo);

const api = client(base);
const lease = async (ttl = "120s") => (await api("POST", "/v1/leases", { ttl })).json.id;

let running = true;
const until = Date.now() + seconds * 1000;

// A client that takes a lock, holds it a while, lets go, and comes back.
async function worker(lock, holdMs, pauseMs) {
  const id = await lease();
  while (running) {
    const got = await api("POST", `/v1/locks/${lock}/acquire?wait=20s`, { lease: id });
    if (got.status !== 200) continue;
    await sleep(random(...holdMs));
    await api("DELETE", `/v1/locks/${lock}/handles/${got.json.handle}`);
    await sleep(random(...pauseMs));
  }
}

async function producer(queue, perSecond) {
  let n = 0;
  while (running) {
    await api("POST", `/v1/queues/${queue}/items`, { n: n++ });
    await sleep(1000 / perSecond);
  }
}

async function consumer(queue, perSecond) {
  while (running) {
    const taken = await api("POST", `/v1/queues/${queue}/take?wait=2s&ack_deadline=30s`);
    if (taken.status === 200) {
      await sleep(1000 / perSecond);
      await api("POST", `/v1/queues/${queue}/claims/${taken.json.claim}/ack`);
    }
  }
}

const tasks = [];
// A hot lock, a warm one, a quiet one, and one whose holder is asked to give it back.
for (let i = 0; i < 6; i++) tasks.push(worker("orders", [400, 1200], [0, 200]));
for (let i = 0; i < 2; i++) tasks.push(worker("inventory", [200, 800], [300, 900]));
const billing = await lease();
await api("POST", "/v1/locks/billing/acquire?wait=0", { lease: billing });
const reportsHolder = await lease();
await api("POST", "/v1/locks/reports/acquire?wait=0", { lease: reportsHolder });
await api("POST", "/v1/locks/reports/acquire?wait=0&keep_queued=true", { lease: await lease() });
await api("POST", "/v1/locks/reports/revoke", { by: "ops@example.com", reason: "nightly maintenance" });
// Readers share, a writer waits.
for (let i = 0; i < 2; i++) await api("POST", "/v1/rwlocks/catalog/read?wait=0", { lease: await lease() });
await api("POST", "/v1/rwlocks/catalog/write?wait=0&keep_queued=true", { lease: await lease() });
// A semaphore with two of its three permits taken.
for (let i = 0; i < 2; i++) await api("POST", "/v1/semaphores/exports/acquire?permits=3&wait=0", { lease: await lease() });
// A queue that backs up, one that keeps up.
tasks.push(producer("emails", 4), consumer("emails", 2));
tasks.push(producer("thumbnails", 3), consumer("thumbnails", 5));
// An election, a group, a double barrier still gathering, a transaction half voted.
for (const value of ["scheduler-a", "scheduler-b", "scheduler-c"]) {
  await api("POST", "/v1/elections/scheduler/campaign?wait=0", { lease: await lease(), value });
}
for (const member of ["w1", "w2", "w3", "w4"]) {
  await api("PUT", `/v1/groups/workers/members/${member}`, { lease: await lease() });
}
for (const participant of ["a", "b"]) {
  await api("POST", "/v1/double-barriers/batch-7/enter?wait=0", { participant, size: 4, lease: await lease() });
}
await api("POST", "/v1/txns", { id: "order-42", participants: ["billing", "stock"], deadline: "10m" });
await api("PUT", "/v1/txns/order-42/participants/billing", { lease: await lease() });
await api("POST", "/v1/txns/order-42/participants/billing/vote", { vote: "commit" });

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  // Tall enough for every section to be in view (the page follows rows only there).
  const page = await browser.newPage({ viewport: { width: 1440, height: 2000 } });
  await page.goto(base + "/");
  await page.waitForSelector("#live.ok");
  while (Date.now() < until) await sleep(500);
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log("screenshot:", screenshot);
} finally {
  running = false;
  await browser.close();
}
process.exit(0);
