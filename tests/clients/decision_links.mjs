// Slack-ready approvals in real headless Chromium, driven by playwright-core: the Approve and
// Deny links that a fake Slack endpoint captured from the Block Kit messages are followed as a
// person on a phone would (the confirmation page, then the decision, made once), and the
// console's Notifications view lists the deliveries and sends a test event. Run by
// tests/e2e/clients/decision_links.rs; every case prints `ok - NAME`. Any request to a
// non-loopback address, any page error and any console error fails the run.
//
// Env: TURNSTILE_URL, TURNSTILE_APPROVER_KEY (an approver), TURNSTILE_APPROVE_URL and
// TURNSTILE_APPROVE_ID (the Approve link of one pending approval and its id),
// TURNSTILE_DENY_URL and TURNSTILE_DENY_ID (the Deny link of another),
// TURNSTILE_CHROMIUM (default /usr/bin/chromium), TURNSTILE_SCREENSHOTS (a folder).

import assert from "node:assert/strict";
import { run, shot, watch } from "./browser.mjs";

const BASE = process.env.TURNSTILE_URL;
const ROOT = process.env.TURNSTILE_APPROVER_KEY;
const APPROVE = { url: process.env.TURNSTILE_APPROVE_URL, id: process.env.TURNSTILE_APPROVE_ID };
const DENY = { url: process.env.TURNSTILE_DENY_URL, id: process.env.TURNSTILE_DENY_ID };
const WAIT = 20000;

async function approval(id) {
  const r = await fetch(`${BASE}/v1/approvals/${id}`, { headers: { authorization: `Bearer ${ROOT}` } });
  assert.equal(r.status, 200);
  return r.json();
}

async function newPage(browser, viewport = { width: 390, height: 844 }) {
  const context = await browser.newContext({ viewport, isMobile: viewport.width < 600 });
  const page = await context.newPage();
  watch(context, page);
  return { context, page };
}

const cases = [];
const test = (name, fn) => cases.push({ name, fn });

test("opening the Approve link shows a confirmation page and decides nothing", async (browser) => {
  const { context, page } = await newPage(browser);
  const resp = await page.goto(APPROVE.url);
  assert.equal(resp.status(), 200);
  assert.equal(resp.headers()["cache-control"], "no-store");
  assert.equal(resp.headers()["referrer-policy"], "no-referrer");
  assert.match(await page.title(), /^Approve /);
  await page.getByRole("button", { name: "Approve" }).waitFor({ timeout: WAIT });
  assert.equal(await page.locator("script").count(), 0, "a script on the page");
  assert.equal((await approval(APPROVE.id)).state, "pending");
  await shot(page, "link-confirm");
  // Opened again (a link preview, a second tap): still only the page.
  await page.reload();
  assert.equal((await approval(APPROVE.id)).state, "pending");
  await context.close();
});

test("confirming approves once; the link then shows it was used", async (browser) => {
  const { context, page } = await newPage(browser);
  await page.goto(APPROVE.url);
  await Promise.all([
    page.waitForNavigation({ timeout: WAIT }),
    page.getByRole("button", { name: "Approve" }).click(),
  ]);
  await page.getByRole("heading", { name: "Approved" }).waitFor({ timeout: WAIT });
  assert.match(await page.locator("main").innerText(), /by webhook:slack/);
  await shot(page, "link-approved");
  const r = await approval(APPROVE.id);
  assert.equal(r.state, "approved");
  assert.equal(r.decided_by, "webhook:slack");
  // Back and confirm again: refused, nothing changes.
  const again = await page.goto(APPROVE.url);
  assert.equal(again.status(), 410);
  assert.match(await page.locator("main").innerText(), /already used/);
  const repost = await fetch(APPROVE.url, { method: "POST" });
  assert.equal(repost.status, 410);
  assert.equal((await approval(APPROVE.id)).decided_by, "webhook:slack");
  await context.close();
});

test("the Deny link of another approval denies it", async (browser) => {
  const { context, page } = await newPage(browser, { width: 1200, height: 800 });
  const resp = await page.goto(DENY.url);
  assert.equal(resp.status(), 200);
  await Promise.all([
    page.waitForNavigation({ timeout: WAIT }),
    page.getByRole("button", { name: "Deny" }).click(),
  ]);
  await page.getByRole("heading", { name: "Denied" }).waitFor({ timeout: WAIT });
  await shot(page, "link-denied");
  const r = await approval(DENY.id);
  assert.equal(r.state, "denied");
  assert.equal(r.decided_by, "webhook:slack");
  await context.close();
});

test("the console's Notifications view lists deliveries and sends a test event", async (browser) => {
  const { context, page } = await newPage(browser, { width: 1280, height: 900 });
  await page.goto(`${BASE}/console`);
  await page.getByLabel("API key or JWT").fill(ROOT);
  await page.getByRole("button", { name: "Sign in" }).click();
  const tab = page.getByRole("tab", { name: "Notifications" });
  await tab.waitFor({ timeout: WAIT });
  await tab.click();
  const endpoint = page.locator('#endpoints-rows tr[data-endpoint="slack"]');
  await endpoint.waitFor({ timeout: WAIT });
  assert.match(await endpoint.innerText(), /slack/);
  await page.locator('#deliveries-rows td', { hasText: "approval.pending" }).first().waitFor({ timeout: WAIT });
  await endpoint.getByRole("button", { name: "Send test event" }).click();
  const status = page.locator("#notifications-status");
  await page.waitForFunction(() => /queued for slack/.test(document.querySelector("#notifications-status").textContent), null, { timeout: WAIT });
  const id = (await status.textContent()).match(/msg_[0-9a-f]+/)[0];
  await page.locator(`#deliveries-rows tr[data-id="${id}"]`).waitFor({ timeout: WAIT });
  await shot(page, "notifications");
  await context.close();
});

await run("decision links", cases);
