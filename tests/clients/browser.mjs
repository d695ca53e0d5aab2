// What the browser test scripts share: headless Chromium (Debian's, driven by playwright-core),
// the record of any page error, console error (a CSP violation is one) or request to a
// non-loopback address, screenshots, and running the cases (each prints `ok - NAME`).

import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const SHOTS = process.env.TURNSTILE_SCREENSHOTS;

/** A streaming chat of `key`'s on `model` at gateway `base`; resolves once the stream ends,
 *  with its status and the text its deltas carried. */
export function streamingChat(base, key, model, prompt = "go") {
  return fetch(`${base}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, stream: true, messages: [{ role: "user", content: prompt }] }),
  }).then(async (r) => ({ status: r.status, text: streamed(await r.text()) }));
}

/** The text of a streamed chat answer's deltas. */
export function streamed(body) {
  let text = "";
  for (const line of body.split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const ev = JSON.parse(line.slice(6));
    text += (ev.choices && ev.choices[0] && ev.choices[0].delta && ev.choices[0].delta.content) || "";
  }
  return text;
}

/** Requests a page made to anything but loopback, and page or console errors. */
export const external = [];
export const problems = [];

export function loopback(raw) {
  const u = new URL(raw);
  if (["data:", "blob:", "about:"].includes(u.protocol)) return true;
  return ["127.0.0.1", "localhost", "[::1]"].includes(u.hostname);
}

export async function shot(page, name) {
  if (!SHOTS) return;
  await page.screenshot({ path: join(SHOTS, `${name}.png`), fullPage: true });
}

/** Watches `context`'s requests and `page`'s errors. A refused request (401, 409, an aborted
 *  stream) is logged by Chromium itself and is part of what the cases provoke. */
export function watch(context, page) {
  context.on("request", (req) => {
    if (!loopback(req.url())) external.push(req.url());
  });
  page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource:")) {
      problems.push(`console error: ${m.text()}`);
    }
  });
}

/** Runs `cases` ({name, fn(browser)}) in one Chromium, those whose name contains `only` if
 *  set; prints `ok - NAME` or `not ok - NAME` and a `LABEL: N passed, N failed` line, and
 *  exits 1 on any failure. */
export async function run(label, cases, only) {
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.TURNSTILE_CHROMIUM || "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  let failed = 0;
  for (const { name, fn } of cases) {
    if (only && !name.includes(only)) continue;
    const before = problems.length;
    try {
      await fn(browser);
      assert.deepEqual(problems.slice(before), [], "page or console errors");
      console.log(`ok - ${name}`);
    } catch (e) {
      failed++;
      console.log(`not ok - ${name}\n${e.stack}`);
    }
  }
  await browser.close();
  if (external.length) {
    failed++;
    console.log(`not ok - non-loopback requests: ${external.join(", ")}`);
  }
  console.log(`${label}: ${cases.length - failed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}
