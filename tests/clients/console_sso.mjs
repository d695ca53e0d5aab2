// The console signed in through the identity provider, in real headless Chromium (driven by
// playwright-core): the provider's own login and consent pages (oidc-provider's), back to the
// console with an HttpOnly, SameSite=Strict session cookie, a decision made, sign-out, and
// the stale cookie refused. Run by tests/e2e/clients/console_sso.rs; prints `ok - NAME`.
//
// Env: TURNSTILE_URL (the gateway), TURNSTILE_KEY (alice, whose turn waits on an approval),
// TURNSTILE_CHROMIUM, TURNSTILE_SCREENSHOTS.

import assert from "node:assert/strict";
import { run, shot, streamingChat, watch } from "./browser.mjs";

const BASE = process.env.TURNSTILE_URL;
const ALICE = process.env.TURNSTILE_KEY;
const WAIT = 20000;

async function api(path, headers = {}, init = {}) {
  const r = await fetch(`${BASE}${path}`, { ...init, headers });
  return { status: r.status, body: await r.json().catch(() => null) };
}

async function pendingId() {
  const until = Date.now() + WAIT;
  while (Date.now() < until) {
    const { body } = await api("/v1/approvals?state=pending", { authorization: `Bearer ${ALICE}` });
    if (body && body.data && body.data.length) return body.data[0].id;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("no approval became pending");
}

const cases = [];
const test = (name, fn) => cases.push({ name, fn });

test("sign in through the provider, decide, sign out; the stale cookie is refused", async (browser) => {
  // The provider's certificate is the test's own authority's.
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1200, height: 860 } });
  const page = await context.newPage();
  watch(context, page);
  const done = streamingChat(BASE, ALICE, "cmd-ask");
  const id = await pendingId();

  await page.goto(`${BASE}/console/`);
  const link = page.getByRole("link", { name: /^Sign in with 127\.0\.0\.1:\d+$/ });
  await link.waitFor({ timeout: WAIT });
  await link.click();
  // The provider's login page, then its consent page.
  await page.locator('input[name="login"]').waitFor({ timeout: WAIT });
  await shot(page, "sso-provider-login");
  await page.locator('input[name="login"]').fill("bob");
  await page.locator('input[name="password"]').fill("any");
  await page.getByRole("button", { name: "Sign-in" }).click();
  await page.getByRole("button", { name: "Continue" }).click({ timeout: WAIT });
  // Back in the console, signed in as the provider's subject, an approver by group.
  await page.locator("#conn[data-state=live]").waitFor({ timeout: WAIT });
  const who = await page.locator("#who").textContent();
  assert.match(who, /^Signed in as jwt:https:\/\/127\.0\.0\.1:\d+#bob \(approver\)$/);
  assert.equal(await page.evaluate(() => sessionStorage.length + localStorage.length), 0, "nothing kept by the page");
  const cookies = await context.cookies(BASE);
  const session = cookies.find((c) => c.name === "turnstile-console");
  assert.ok(session, JSON.stringify(cookies));
  assert.equal(session.httpOnly, true);
  assert.equal(session.sameSite, "Strict");
  assert.equal(session.secure, false, "plain HTTP on loopback");
  assert.ok(!cookies.some((c) => c.name === "turnstile-login"), "the flow's state cookie is cleared");
  // The page cannot read it.
  assert.equal(await page.evaluate(() => document.cookie.includes("turnstile-console")), false);

  // The cookie alone is no credential: a request without the CSRF token is refused.
  const cookie = `turnstile-console=${session.value}`;
  assert.equal((await api("/v1/whoami", { cookie })).status, 401);
  const { body: s } = await api("/console/sso/session", { cookie });
  assert.equal((await api("/v1/whoami", { cookie, "x-turnstile-csrf": s.csrf })).status, 200);
  assert.equal((await api("/v1/whoami", { cookie, "x-turnstile-csrf": "0".repeat(64) })).status, 401);

  // A decision, made through the console.
  const card = page.locator(`.card[data-id="${id}"]`);
  await card.getByRole("button", { name: "Approve" }).click({ timeout: WAIT });
  const dialog = page.locator("#confirm");
  await dialog.waitFor({ state: "visible", timeout: WAIT });
  await dialog.getByRole("button", { name: "Approve" }).click();
  const finished = await done;
  assert.equal(finished.status, 200);
  assert.ok(finished.text.includes("Command ran."), finished.text);
  const { body: record } = await api(`/v1/approvals/${id}`, { authorization: `Bearer ${ALICE}` });
  assert.equal(record.state, "approved");
  assert.match(record.decided_by, /#bob$/);
  await shot(page, "sso-signed-in");

  // Sign-out: the session ends at the gateway and the cookie goes.
  await page.getByRole("button", { name: "Sign out" }).click();
  await page.locator("#signin").waitFor({ state: "visible", timeout: WAIT });
  const until = Date.now() + WAIT;
  while ((await context.cookies(BASE)).some((c) => c.name === "turnstile-console") && Date.now() < until) {
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(!(await context.cookies(BASE)).some((c) => c.name === "turnstile-console"), "cookie cleared");
  // The stale cookie, replayed, is refused everywhere.
  assert.equal((await api("/console/sso/session", { cookie })).status, 401);
  assert.equal((await api("/v1/whoami", { cookie, "x-turnstile-csrf": s.csrf })).status, 401);
  await context.addCookies([{ ...session }]);
  await page.reload();
  await page.locator("#signin").waitFor({ state: "visible", timeout: WAIT });
  assert.equal(await page.locator("#app").isVisible(), false);
  await context.close();
});

await run("console sso", cases, process.env.TURNSTILE_CONSOLE_ONLY);
