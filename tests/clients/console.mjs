// The console (`GET /console`) in real headless Chromium, driven by playwright-core. Run by
// tests/e2e/console.rs against a gateway on the demo backend; every case prints `ok - NAME`.
// Any request a page makes to a non-loopback address, any page error and any console error
// (a CSP violation is one) fails the run.
//
// Env: TURNSTILE_URL (http://127.0.0.1:PORT), TURNSTILE_APPROVER_KEY (an approver),
// TURNSTILE_APPROVER_JWT (a JWT of the approver `approver-bot`), TURNSTILE_KEY (alice, who owns the turns), TURNSTILE_OTHER_KEY (bob, a foreign principal),
// TURNSTILE_CHROMIUM (default /usr/bin/chromium), TURNSTILE_SCREENSHOTS (a folder).

import assert from "node:assert/strict";
import { run, shot, streamingChat, watch } from "./browser.mjs";

const BASE = process.env.TURNSTILE_URL;
const ROOT = process.env.TURNSTILE_APPROVER_KEY;
const BOT_JWT = process.env.TURNSTILE_APPROVER_JWT;
const ALICE = process.env.TURNSTILE_KEY;
const BOB = process.env.TURNSTILE_OTHER_KEY;
const WAIT = 20000; // bound on any single wait

// ------------------------------------------------------------------ gateway side

async function api(key, path, init = {}) {
  const r = await fetch(`${BASE}${path}`, {
    ...init,
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...(init.headers || {}) },
  });
  return { status: r.status, body: await r.json().catch(() => null) };
}

/** A streaming chat of alice's on `model`; resolves once the stream ends. */
function chat(model, prompt = "go", key = ALICE) {
  return streamingChat(BASE, key, model, prompt);
}

/** The ids of alice's pending approvals, newest first. */
async function pendingIds() {
  const { body } = await api(ALICE, "/v1/approvals?state=pending");
  return body.data.map((r) => r.id);
}

/** Waits until an approval not in `known` is pending; returns its id. */
async function nextApproval(known) {
  const until = Date.now() + WAIT;
  while (Date.now() < until) {
    const fresh = (await pendingIds()).find((id) => !known.includes(id));
    if (fresh) return fresh;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("no approval became pending");
}

/** Starts a turn that waits on a command approval; returns {id, done}. */
async function waitingTurn() {
  const known = await pendingIds();
  const done = chat("cmd-ask");
  return { id: await nextApproval(known), done };
}

// ------------------------------------------------------------------ browser side

async function newConsole(browser, { viewport = { width: 1200, height: 860 }, notifications = false } = {}) {
  const context = await browser.newContext({ viewport });
  // Headless Chromium shows no notification UI: the page gets a stand-in that records what
  // it was asked (permission requests, notifications shown) and starts at "default".
  await context.addInitScript((grant) => {
    const log = (window.__notes = { asked: 0, shown: [] });
    let permission = "default";
    window.Notification = class {
      constructor(title, opts) {
        log.shown.push({ title, body: opts && opts.body });
      }
      static get permission() {
        return permission;
      }
      static async requestPermission() {
        log.asked++;
        permission = grant ? "granted" : "denied";
        return permission;
      }
    };
  }, notifications);
  const page = await context.newPage();
  watch(context, page);
  await page.goto(`${BASE}/console`);
  return { context, page };
}

async function signIn(page, key) {
  await page.getByLabel("API key or JWT").fill(key);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#conn[data-state=live]").waitFor({ timeout: WAIT });
}

const card = (page, id) => page.locator(`.card[data-id="${id}"]`);

async function decide(page, id, verb, reason) {
  const c = card(page, id);
  await c.getByRole("button", { name: verb === "approve" ? "Approve" : "Deny" }).click();
  const dialog = page.locator("#confirm");
  await dialog.waitFor({ state: "visible", timeout: WAIT });
  if (reason) await page.getByLabel("Reason (optional)").fill(reason);
  await dialog.getByRole("button", { name: verb === "approve" ? "Approve" : "Deny" }).click();
}

async function outcome(page, id) {
  const o = card(page, id).locator(".outcome");
  await page.waitForFunction(
    (sel) => {
      const t = document.querySelector(sel);
      return t && t.textContent && !t.textContent.startsWith("Recording");
    },
    `.card[data-id="${id}"] .outcome`,
    { timeout: WAIT },
  );
  return o.textContent();
}

// ------------------------------------------------------------------ cases

const cases = [];
const test = (name, fn) => cases.push({ name, fn });

test("the page has a strict CSP and loads only its own assets", async (browser) => {
  const r = await fetch(`${BASE}/console`);
  assert.equal(r.status, 200);
  const csp = r.headers.get("content-security-policy");
  assert.ok(csp, "no CSP header");
  for (const part of ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]) {
    assert.ok(csp.includes(part), `CSP lacks ${part}: ${csp}`);
  }
  assert.ok(!csp.includes("unsafe"), csp);
  const html = await r.text();
  assert.ok(!/<script(?![^>]*\ssrc=)[^>]*>/i.test(html), "an inline script");
  assert.ok(!/\son[a-z]+=/i.test(html), "an inline event handler");
  const { context, page } = await newConsole(browser);
  const loaded = [];
  page.on("request", (req) => loaded.push(new URL(req.url()).pathname));
  // The page also asks how it may sign in, and whether a provider's session is open.
  const asked = page.waitForResponse((r) => r.url().endsWith("/console/sso/session"));
  await page.reload();
  await asked;
  await page.getByLabel("API key or JWT").waitFor();
  const assets = [
    "", "/api.js", "/app.css", "/app.js", "/dom.js", "/icon.svg", "/notifications.js", "/queue.js",
    "/sso/providers", "/sso/session", "/views.js",
  ];
  assert.deepEqual([...new Set(loaded)].sort(), assets.map((a) => `/console${a}`));
  await context.close();
});

test("a wrong key is refused and nothing is kept", async (browser) => {
  const { context, page } = await newConsole(browser);
  await page.getByLabel("API key or JWT").fill("sk-not-a-key");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "refused" }).waitFor({ timeout: WAIT });
  assert.equal(await page.locator("#app").isVisible(), false);
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await shot(page, "signin-refused");
  await context.close();
});

test("a pending approval appears live; approving it finishes the waiting chat stream", async (browser) => {
  const { context, page } = await newConsole(browser, { notifications: true });
  // Permission is asked only when the approver asks for notifications.
  assert.equal(await page.evaluate(() => window.__notes.asked), 0);
  await signIn(page, ROOT);
  await page.getByRole("button", { name: "Enable notifications" }).click();
  assert.equal(await page.evaluate(() => window.__notes.asked), 1);
  await page.getByRole("button", { name: "Enable notifications" }).waitFor({ state: "hidden" });
  const turn = await waitingTurn();
  const c = card(page, turn.id);
  await c.waitFor({ timeout: WAIT });
  // It arrived as a `created` event (a re-read of the list would say "list").
  assert.equal(await c.getAttribute("data-arrived"), "event");
  const text = await c.textContent();
  for (const part of ["rm -rf build", "clean the build", "alice", "cmd-ask", "expires in", "asked"]) {
    assert.ok(text.includes(part), `card lacks ${part}: ${text}`);
  }
  assert.match(await page.title(), /^\(1\) /);
  assert.equal(await page.locator("#pending-count").textContent(), "1");
  assert.ok((await page.locator("#announce").textContent()).startsWith("New approval from alice: command"));
  const notes = await page.evaluate(() => window.__notes.shown);
  assert.equal(notes.length, 1);
  assert.ok(notes[0].body.includes("rm -rf build"), JSON.stringify(notes));
  await shot(page, "pending");
  await decide(page, turn.id, "approve", "build dir only");
  assert.equal(await outcome(page, turn.id), "Approved by you (root). Reason: build dir only");
  const done = await turn.done;
  assert.equal(done.status, 200);
  assert.ok(done.text.includes("Command ran."), done.text);
  assert.equal(await card(page, turn.id).getAttribute("data-state"), "approved");
  assert.doesNotMatch(await page.title(), /^\(/);
  await shot(page, "settled");
  const { body } = await api(ROOT, `/v1/approvals/${turn.id}`);
  assert.equal(body.state, "approved");
  assert.equal(body.decided_by, "root");
  assert.equal(body.decision_reason, "build dir only");
  await context.close();
});

test("a JWT signs in as its principal and decides as it", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, BOT_JWT);
  assert.equal(await page.locator("#who").textContent(), "Signed in as approver-bot (approver)");
  const turn = await waitingTurn();
  await card(page, turn.id).waitFor({ timeout: WAIT });
  await decide(page, turn.id, "approve");
  assert.equal(await outcome(page, turn.id), "Approved by you (approver-bot).");
  assert.ok((await turn.done).text.includes("Command ran."));
  assert.equal((await api(ROOT, `/v1/approvals/${turn.id}`)).body.decided_by, "approver-bot");
  await context.close();
});

test("denying another declines the command", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, ROOT);
  const turn = await waitingTurn();
  await card(page, turn.id).waitFor({ timeout: WAIT });
  await decide(page, turn.id, "deny", "not now");
  assert.equal(await outcome(page, turn.id), "Denied by you (root). Reason: not now");
  const done = await turn.done;
  assert.ok(done.text.includes("Command declined."), done.text);
  await shot(page, "denied");
  await context.close();
});

test("keyboard only: arrows move, a approves and d denies after a confirmation", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, ROOT);
  const first = await waitingTurn();
  await card(page, first.id).waitFor({ timeout: WAIT });
  const second = await waitingTurn();
  await card(page, second.id).waitFor({ timeout: WAIT });
  // Tab from the top of the page until a card has focus.
  await page.locator("body").focus();
  let focused = null;
  for (let i = 0; i < 30 && !focused; i++) {
    await page.keyboard.press("Tab");
    focused = await page.evaluate(() => document.activeElement.closest(".card")?.dataset.id || null);
  }
  assert.equal(focused, second.id, "newest first, and the first card takes the focus");
  const focusedId = () => page.evaluate(() => document.activeElement.dataset.id);
  await page.keyboard.press("ArrowDown");
  assert.equal(await focusedId(), first.id);
  await page.keyboard.press("ArrowUp");
  assert.equal(await focusedId(), second.id);
  // `a` asks first; Escape keeps the approval pending.
  await page.keyboard.press("a");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await page.keyboard.press("Escape");
  await page.locator("#confirm").waitFor({ state: "hidden" });
  assert.equal(await focusedId(), second.id);
  assert.equal(await card(page, second.id).getAttribute("data-state"), "pending");
  await page.keyboard.press("a");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await page.keyboard.press("Enter");
  assert.equal(await outcome(page, second.id), "Approved by you (root).");
  assert.ok((await second.done).text.includes("Command ran."));
  await page.keyboard.press("ArrowDown");
  assert.equal(await focusedId(), first.id);
  await page.keyboard.press("d");
  await page.locator("#confirm").waitFor({ state: "visible" });
  await page.keyboard.type("typed reason");
  await page.keyboard.press("Enter");
  assert.equal(await outcome(page, first.id), "Denied by you (root). Reason: typed reason");
  assert.ok((await first.done).text.includes("Command declined."));
  await context.close();
});

test("two consoles race on one approval: one wins, the other shows the settled record", async (browser) => {
  const a = await newConsole(browser);
  const b = await newConsole(browser);
  await signIn(a.page, ROOT);
  await signIn(b.page, ALICE);
  // Both open the confirmation, then both confirm at once.
  const turn = await waitingTurn();
  for (const p of [a.page, b.page]) {
    await card(p, turn.id).getByRole("button", { name: "Approve" }).click({ timeout: WAIT });
    await p.locator("#confirm").waitFor({ state: "visible", timeout: WAIT });
  }
  await Promise.all([a.page, b.page].map((p) => p.locator("#confirm").getByRole("button", { name: "Approve" }).click()));
  const [oa, ob] = [await outcome(a.page, turn.id), await outcome(b.page, turn.id)];
  const { body } = await api(ROOT, `/v1/approvals/${turn.id}`);
  const winner = body.decided_by;
  assert.ok(["root", "alice"].includes(winner), JSON.stringify(body));
  const [mine, theirs] = winner === "root" ? [oa, ob] : [ob, oa];
  assert.equal(mine, `Approved by you (${winner}).`);
  assert.ok(theirs.includes(`by ${winner}`) && !theirs.includes("you"), theirs);
  assert.ok((await turn.done).text.includes("Command ran."));
  // The loser's decision reaches the gateway after the winner's: it reads "already decided".
  const late = await waitingTurn();
  await card(a.page, late.id).waitFor({ timeout: WAIT });
  await card(b.page, late.id).waitFor({ timeout: WAIT });
  await b.page.locator(`.card[data-id="${late.id}"] .deny`).click();
  await b.page.locator("#confirm").waitFor({ state: "visible" });
  await decide(a.page, late.id, "approve");
  assert.equal(await outcome(a.page, late.id), "Approved by you (root).");
  // b sees the settled state at once, from the event stream, dialog still open.
  await b.page.waitForFunction((id) => document.querySelector(`.card[data-id="${id}"]`)?.dataset.state === "approved", late.id, { timeout: WAIT });
  await b.page.locator("#confirm").getByRole("button", { name: "Deny" }).click();
  await b.page.waitForFunction((id) => document.querySelector(`.card[data-id="${id}"] .outcome`)?.textContent.startsWith("Already decided"), late.id, { timeout: WAIT });
  assert.equal(await outcome(b.page, late.id), "Already decided by root: approved.");
  await shot(b.page, "race-loser");
  assert.ok((await late.done).text.includes("Command ran."));
  await a.context.close();
  await b.context.close();
});

test("the stream reconnects by itself and shows it", async (browser) => {
  const { context, page } = await newConsole(browser);
  let block = true;
  await context.route("**/v1/approvals/events", (route) => (block ? route.abort() : route.fallback()));
  await page.getByLabel("API key or JWT").fill(ROOT);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#conn[data-state=reconnecting]").waitFor({ timeout: WAIT });
  assert.equal(await page.locator("#conn").textContent(), "Reconnecting…");
  await shot(page, "reconnecting");
  block = false;
  await context.unroute("**/v1/approvals/events");
  await page.locator("#conn[data-state=live]").waitFor({ timeout: WAIT });
  const turn = await waitingTurn();
  await card(page, turn.id).waitFor({ timeout: WAIT });
  await decide(page, turn.id, "approve");
  assert.ok((await turn.done).text.includes("Command ran."));
  await context.close();
});

test("a foreign principal sees nothing of alice's", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, BOB);
  const turn = await waitingTurn();
  // The approver's view has it; bob's page neither now nor after a re-read.
  assert.equal((await api(ROOT, `/v1/approvals/${turn.id}`)).status, 200);
  await page.reload();
  await page.locator("#conn[data-state=live]").waitFor({ timeout: WAIT });
  assert.equal(await page.locator(".card").count(), 0);
  assert.equal(await page.locator("#pending-count").textContent(), "0");
  await page.getByRole("tab", { name: "History" }).click();
  await page.locator("#history-empty").waitFor({ state: "visible", timeout: WAIT });
  await page.getByRole("tab", { name: "Activity" }).click();
  await page.locator("#executions-rows .empty").waitFor({ timeout: WAIT });
  const activity = await page.locator("#view-activity").textContent();
  assert.ok(!activity.includes("alice"), activity);
  assert.equal((await api(ROOT, `/v1/approvals/${turn.id}/decision`, { method: "POST", body: JSON.stringify({ decision: "deny" }) })).status, 200);
  await turn.done;
  await context.close();
});

test("history filters by state and reason", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, ROOT);
  await page.getByRole("tab", { name: "History" }).click();
  await page.locator("#history-rows tr").first().waitFor({ timeout: WAIT });
  const states = async () => page.locator("#history-rows tr").evaluateAll((rows) => rows.map((r) => r.dataset.state));
  const all = await states();
  assert.ok(all.includes("approved") && all.includes("denied"), all.join());
  await page.getByLabel("State", { exact: true }).selectOption("denied");
  await page.waitForFunction(() => [...document.querySelectorAll("#history-rows tr")].every((r) => r.dataset.state === "denied"), null, { timeout: WAIT });
  await page.getByLabel("Reason", { exact: true }).selectOption("expired");
  await page.locator("#history-empty").waitFor({ state: "visible", timeout: WAIT });
  await page.getByLabel("Reason", { exact: true }).selectOption("human");
  await page.locator("#history-rows tr").first().waitFor({ timeout: WAIT });
  await shot(page, "history");
  await context.close();
});

test("activity: held calls, kept threads, today's usage and spend, the budget, backends", async (browser) => {
  // A held tool call and a completed turn (its thread is kept) of alice's.
  const tool = await api(ALICE, "/v1/chat/completions", {
    method: "POST",
    body: JSON.stringify({
      model: "tool",
      messages: [{ role: "user", content: "read /etc/hostname" }],
      tools: [{ type: "function", function: { name: "read_file", parameters: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } } }],
    }),
  });
  assert.equal(tool.status, 200, JSON.stringify(tool.body));
  const held = tool.body.id.replace(/^chatcmpl-/, "exe-");
  const echo = await api(ALICE, "/v1/chat/completions", { method: "POST", body: JSON.stringify({ model: "echo", messages: [{ role: "user", content: "hi" }] }) });
  assert.equal(echo.status, 200);
  // A priced turn ($1): its spend, and alice's budget with what is left of it.
  const priced = await api(ALICE, "/v1/chat/completions", { method: "POST", body: JSON.stringify({ model: "p-echo", messages: [{ role: "user", content: "hi" }] }) });
  assert.equal(priced.status, 200);
  const { context, page } = await newConsole(browser);
  await signIn(page, ALICE);
  await page.getByRole("tab", { name: "Activity" }).click();
  const row = page.locator(`#executions-rows tr[data-id="${held}"]`);
  await row.waitFor({ timeout: WAIT });
  const cells = await row.locator("td").allTextContents();
  assert.equal(cells[1], "alice");
  assert.equal(cells[2], "tool");
  assert.equal(cells[3], "1: read_file");
  assert.equal(cells[4], "held");
  assert.match(cells[7], /^in \d/);
  await page.locator("#threads-rows tr[data-id]").first().waitFor({ timeout: WAIT });
  await page.locator('#usage-rows tr[data-model="echo"]').waitFor({ timeout: WAIT });
  const spend = await page.locator('#usage-rows tr[data-model="p-echo"] td').allTextContents();
  assert.equal(spend[6], "$1.00");
  const day = await page.locator('#budget-rows tr[data-cap="usd_per_day"] td').allTextContents();
  assert.deepEqual(day.slice(0, 4), ["usd_per_day", "$50.00", "$1.00", "$49.00"]);
  assert.match(day[4], /^\d{4}-\d{2}-\d{2}$/);
  const backend = await page.locator('#backends-rows tr[data-backend="demo"] td').allTextContents();
  assert.deepEqual(backend.slice(0, 3), ["demo", "app-server", "ok"]);
  assert.equal(await page.locator("html").evaluate((h) => h.scrollWidth <= h.clientWidth), true);
  await shot(page, "activity");
  await context.close();
  // The suspended turn's tokens stay the client's; the console never shows one.
  assert.ok(!cells.join(" ").includes("srct-"));
});

test("narrow window and 200% zoom: no horizontal scroll; arrivals do not move the focused card", async (browser) => {
  const { context, page } = await newConsole(browser, { viewport: { width: 360, height: 640 } });
  await signIn(page, ROOT);
  const first = await waitingTurn();
  await card(page, first.id).waitFor({ timeout: WAIT });
  const second = await waitingTurn();
  await card(page, second.id).waitFor({ timeout: WAIT });
  const noOverflow = () => page.evaluate(() => document.documentElement.scrollWidth <= document.documentElement.clientWidth);
  assert.equal(await noOverflow(), true, "horizontal scroll at 360 px");
  // Focus the older (lower) card; a new approval arrives above it.
  await card(page, first.id).focus();
  const before = await card(page, first.id).evaluate((e) => e.getBoundingClientRect().top);
  const third = await waitingTurn();
  await card(page, third.id).waitFor({ timeout: WAIT });
  const after = await card(page, first.id).evaluate((e) => e.getBoundingClientRect().top);
  assert.ok(Math.abs(after - before) <= 1, `the focused card moved from ${before} to ${after}`);
  await shot(page, "narrow");
  // 200% zoom of a 720 px window lays the page out in 360 CSS pixels.
  const zoomed = await newConsole(browser, { viewport: { width: 720, height: 900 } });
  await zoomed.page.evaluate(() => { document.documentElement.style.zoom = "2"; });
  await signIn(zoomed.page, ROOT);
  await card(zoomed.page, third.id).waitFor({ timeout: WAIT });
  const wide = await zoomed.page.evaluate(() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]);
  assert.ok(wide[0] <= wide[1], `horizontal scroll at 200%: ${wide}`);
  await shot(zoomed.page, "zoom-200");
  await zoomed.context.close();
  for (const t of [first, second, third]) {
    await api(ROOT, `/v1/approvals/${t.id}/decision`, { method: "POST", body: JSON.stringify({ decision: "deny" }) });
    await t.done;
  }
  await context.close();
});

test("signing out forgets the credential", async (browser) => {
  const { context, page } = await newConsole(browser);
  await signIn(page, ROOT);
  assert.equal(await page.evaluate(() => sessionStorage.length), 1);
  // A reload keeps the tab signed in (sessionStorage), nothing else does.
  await page.reload();
  await page.locator("#conn[data-state=live]").waitFor({ timeout: WAIT });
  assert.equal(await page.evaluate(() => localStorage.length), 0);
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByLabel("API key or JWT").waitFor();
  assert.equal(await page.evaluate(() => sessionStorage.length), 0);
  await page.reload();
  await page.getByLabel("API key or JWT").waitFor();
  assert.equal(await page.locator("#app").isVisible(), false);
  await context.close();
});

// ------------------------------------------------------------------ run

await run("console", cases, process.env.TURNSTILE_CONSOLE_ONLY);
