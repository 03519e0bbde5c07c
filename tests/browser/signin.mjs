// The dashboard of a zkgate that wants tokens: without one the page asks for it; once signed
// in it is live and shows a lock taken with the same principal's token; the token never
// travels in a URL (the socket carries it as a subprotocol).
//
//   TOKEN=zkg_... node tests/browser/signin.mjs http://127.0.0.1:PORT
import { chromium } from "playwright-core";
import { client } from "./api.mjs";

const [base] = process.argv.slice(2);
const token = process.env.TOKEN;
if (!base || !token) {
  console.error("usage: TOKEN=... signin.mjs BASE_URL");
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const api = client(base, token);

const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
try {
  const page = await browser.newPage();
  page.on("pageerror", (e) => { console.error("page error:", e.message); process.exitCode = 1; });
  const urls = [];
  page.on("request", (r) => urls.push(r.url()));
  await page.goto(base + "/");
  await page.waitForSelector("#signin:not([hidden])", { timeout: 15000 });
  await page.fill("#token", token);
  await page.click("#signin button");
  await page.waitForSelector("#live.ok", { timeout: 15000 });
  await page.waitForSelector("#signin", { state: "hidden", timeout: 15000 });

  const held = await api("POST", "/v1/locks/signed-in/acquire?wait=0", { ttl: "60s" });
  if (held.status !== 200) throw new Error("acquire: " + held.status);
  const cell = '#locks tr[data-name="signed-in"] td.holder';
  await page.waitForFunction(([s, w]) => document.querySelector(s)?.textContent.trim() === w,
    [cell, "lease " + held.json.lease.id.split("-")[1].slice(0, 8)], { timeout: 15000 });
  const leaked = urls.filter((u) => u.includes(token));
  if (leaked.length) throw new Error("the token appeared in URLs: " + leaked.join(", "));
  console.log("signed in; live; the lock's holder shown; the token in no URL");
} finally {
  await browser.close();
}
