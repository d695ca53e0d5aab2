// The tabs, the History view (settled approvals by state and reason) and the Activity view
// (suspended executions, kept threads, today's usage and spend per model, the caller's budget,
// backends), refreshed every ACTIVITY_MS while it is open.

import { getJson, guard, session } from "./api.js";
import { $, clock, el, now, span, summaryText } from "./dom.js";
import { clearNotifications, startNotifications, stopNotifications } from "./notifications.js";

const ACTIVITY_MS = 5000;

/** Dollars as people read them: cents, or two significant digits below a cent. */
const usd = (n) => (n === 0 || n >= 0.01 ? `$${n.toFixed(2)}` : `$${n.toPrecision(2)}`);
let activityTimer = null;

/** Empties both views (sign-out). */
export function clearViews() {
  stopActivity();
  clearNotifications();
  $("tab-notifications").hidden = true;
  $("history-rows").replaceChildren();
  for (const id of ["executions-rows", "threads-rows", "usage-rows", "budget-rows", "backends-rows"]) $(id).replaceChildren();
}

// ---------------------------------------------------------------- tabs

export const TABS = ["tab-pending", "tab-history", "tab-activity", "tab-notifications"];

/** The tabs shown (Notifications only for an approver on a gateway with endpoints). */
const shown = () => TABS.filter((t) => !$(t).hidden);

export function selectTab(id, focus) {
  for (const t of TABS) {
    const on = t === id;
    const tab = $(t);
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(tab.getAttribute("aria-controls")).hidden = !on;
  }
  if (focus) $(id).focus();
  if (id === "tab-history") loadHistory();
  if (id === "tab-activity") startActivity();
  else stopActivity();
  if (id === "tab-notifications") startNotifications();
  else stopNotifications();
}

export function onTabKey(e) {
  const tabs = shown();
  const i = tabs.indexOf(e.target.id);
  if (i < 0) return;
  let j = null;
  if (e.key === "ArrowRight") j = (i + 1) % tabs.length;
  else if (e.key === "ArrowLeft") j = (i + tabs.length - 1) % tabs.length;
  else if (e.key === "Home") j = 0;
  else if (e.key === "End") j = tabs.length - 1;
  if (j == null) return;
  e.preventDefault();
  selectTab(tabs[j], true);
}

// ---------------------------------------------------------------- history

export async function loadHistory() {
  const gen = session.generation;
  const st = $("filter-state").value;
  const reason = $("filter-reason").value;
  const q = new URLSearchParams();
  if (st) q.set("state", st);
  if (reason) q.set("reason", reason);
  let list;
  try {
    list = await getJson(`/v1/approvals?${q}`);
  } catch (e) {
    if (guard(gen, e)) return;
    $("history-empty").hidden = false;
    $("history-empty").textContent = `Could not load: ${e.message}`;
    return;
  }
  if (gen !== session.generation) return;
  const rows = list.data.filter((r) => r.state !== "pending").map((r) =>
    el("tr", { "data-id": r.id, "data-state": r.state },
      el("td", { text: clock(r.decided_at) }),
      el("td", { text: r.state }),
      el("td", { text: r.reason }),
      el("td", { text: r.decided_by || "—" }),
      el("td", { text: r.decision_reason || "—" }),
      el("td", { text: r.kind }),
      el("td", { class: "mono", text: summaryText(r) }),
      el("td", { text: r.client }),
      el("td", { text: r.model }),
      el("td", { class: "id", text: r.id })));
  $("history-rows").replaceChildren(...rows);
  $("history-empty").textContent = "No settled approval matches.";
  $("history-empty").hidden = rows.length > 0;
}

// ---------------------------------------------------------------- activity

function startActivity() {
  stopActivity();
  loadActivity();
  activityTimer = setInterval(loadActivity, ACTIVITY_MS);
}

function stopActivity() {
  if (activityTimer) clearInterval(activityTimer);
  activityTimer = null;
}

function rowsOrEmpty(tbody, rows, cols, empty) {
  if (rows.length === 0) rows = [el("tr", { class: "empty-row" }, el("td", { colspan: String(cols), class: "empty", text: empty }))];
  $(tbody).replaceChildren(...rows);
}

async function loadActivity() {
  const gen = session.generation;
  const today = new Date().toISOString().slice(0, 10);
  let ex, th, us, be;
  try {
    [ex, th, us, be] = await Promise.all([
      getJson("/v1/activity/executions"),
      getJson("/v1/activity/threads"),
      getJson(`/v1/usage?from=${today}&to=${today}`),
      getJson("/v1/activity/backends"),
    ]);
  } catch (e) {
    if (guard(gen, e)) return;
    $("activity-at").textContent = `Could not refresh: ${e.message}`;
    return;
  }
  if (gen !== session.generation) return;
  const t = now();
  rowsOrEmpty("executions-rows", ex.data.map((x) =>
    el("tr", { "data-id": x.execution_id },
      el("td", { class: "id", text: x.execution_id }),
      el("td", { text: x.client }),
      el("td", { text: x.model }),
      el("td", { text: x.tools.length ? `${x.calls}: ${x.tools.join(", ")}` : String(x.calls) }),
      el("td", { text: x.hold }),
      el("td", { text: String(x.round) }),
      el("td", { text: x.suspended_at == null ? "—" : `${span(t - x.suspended_at)} ago` }),
      el("td", { text: `in ${span(x.deadline_at - t)}` }))), 8, "Nothing is suspended.");
  rowsOrEmpty("threads-rows", th.data.map((x) =>
    el("tr", { "data-id": x.execution_id },
      el("td", { class: "id", text: x.execution_id }),
      el("td", { text: x.client }),
      el("td", { text: x.model }),
      el("td", { text: x.surface }),
      el("td", { text: String(x.messages) }),
      el("td", { text: `${span(t - x.kept_at)} ago` }),
      el("td", { text: x.usable ? `in ${span(x.expires_at - t)}` : "released" }))), 7, "No thread is kept.");
  const perModel = new Map();
  for (const r of us.data) {
    const m = perModel.get(r.model) || { requests: 0, input: 0, cached: 0, output: 0, total: 0, spend: 0 };
    m.requests += r.requests;
    m.input += r.input_tokens;
    m.cached += r.cached_input_tokens;
    m.output += r.output_tokens;
    m.total += r.total_tokens;
    m.spend += r.spend_usd;
    perModel.set(r.model, m);
  }
  rowsOrEmpty("usage-rows", [...perModel.entries()].sort().map(([model, m]) =>
    el("tr", { "data-model": model },
      el("td", { text: model }),
      el("td", { text: String(m.requests) }),
      el("td", { text: String(m.input) }),
      el("td", { text: String(m.cached) }),
      el("td", { text: String(m.output) }),
      el("td", { text: String(m.total) }),
      el("td", { text: usd(m.spend) }))), 7, "No usage today.");
  // A cap in USD or in tokens; the per-execution cap has no window.
  const amount = (cap, n) => (cap.startsWith("usd_") ? usd(n) : String(n));
  rowsOrEmpty("budget-rows", Object.entries(us.budget || {}).map(([cap, b]) =>
    el("tr", { "data-cap": cap },
      el("td", { text: cap }),
      el("td", { text: amount(cap, b.cap) }),
      el("td", { text: b.used == null ? "—" : amount(cap, b.used) }),
      el("td", { text: b.remaining == null ? "—" : amount(cap, b.remaining) }),
      el("td", { text: b.resets_at == null ? "per execution" : b.resets_at.replace("T00:00:00Z", "") }))), 5, "No budget applies to you.");
  rowsOrEmpty("backends-rows", be.data.map((b) =>
    el("tr", { "data-backend": b.name },
      el("td", { text: b.name }),
      el("td", { class: "nowrap", text: b.kind }),
      el("td", { class: `health-${b.status}`, text: b.status }),
      el("td", { text: b.kind === "app-server" ? `${b.busy} / ${b.capacity}` : "—" }),
      el("td", { text: b.kind === "app-server" ? String(b.processes_alive) : "—" }),
      el("td", { text: b.models.join(", ") }))), 6, "No backend serves your models.");
  $("activity-at").textContent = `Last refreshed ${clock(t)}.`;
}
