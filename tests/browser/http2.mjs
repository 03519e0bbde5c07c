// Opens zkgate's dashboard over HTTPS in Debian's chromium, which speaks HTTP/2 to zkgate (ALPN
// `h2`) for the page and HTTP/1.1 for its WebSocket: checks that the page came by HTTP/2, that
// it goes live, and that a lock a client takes shows on it without a reload.
//
//   NODE_EXTRA_CA_CERTS=cert.pem node tests/browser/http2.mjs https://127.0.0.1:PORT
import { chromium } from "playwright-core";
import { client } from "./api.mjs";

const [base] = process.argv.slice(2);
if (!base || !base.startsWith("https://")) {
  console.error("usage: http2.mjs https://HOST:PORT (NODE_EXTRA_CA_CERTS naming its certificate)");
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const api = client(base);

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  // The certificate is the test's own, self-signed.
  const context = await browser.newContext({ ignoreHTTPSErrors: true });
  const page = await context.newPage();
  page.on("pageerror", (e) => { console.error("page error:", e.message); process.exitCode = 1; });
  await page.goto(base + "/");
  const protocol = await page.evaluate(() => performance.getEntriesByType("navigation")[0].nextHopProtocol);
  expect(protocol === "h2", `the page came by ${protocol}, not HTTP/2`);
  await page.waitForSelector("#live.ok", { timeout: 15000 });
  await page.evaluate(() => { window.__noReload = true; });

  const lease = await api("POST", "/v1/leases", { ttl: "60s" });
  expect(lease.status === 201, "lease: " + lease.status);
  const held = await api("POST", "/v1/locks/over-h2/acquire?wait=0", { lease: lease.json.id });
  expect(held.status === 200, "acquire: " + held.status);
  const holder = "lease " + lease.json.id.split("-")[1].slice(0, 8);
  await page.waitForFunction((w) => {
    const e = document.querySelector('#locks tr[data-name="over-h2"] td.holder');
    return e && e.textContent.trim() === w;
  }, holder, { timeout: 15000 }).catch(() => { throw new Error("the lock's holder never showed"); });
  expect(await page.evaluate(() => window.__noReload === true), "the page reloaded");
  console.log(`dashboard over HTTPS: page by ${protocol}, live, the holder shown`);
} finally {
  await browser.close();
}
