// The Notifications view, an approver's: each webhook endpoint with its delivery counts since
// this replica started and a "Send test event" action, and the newest deliveries (any
// replica's). Shown only when the gateway has an endpoint; refreshed every REFRESH_MS while open.

import { api, getJson, guard, session } from "./api.js";
import { $, clock, el } from "./dom.js";

const REFRESH_MS = 5000;
let timer = null;

/** Whether the signed-in principal can see the view (an approver on a gateway with endpoints). */
export async function notificationsAvailable() {
  if (!session.me || !session.me.approver) return false;
  try {
    await getJson("/v1/webhooks");
    return true;
  } catch {
    return false;
  }
}

export function startNotifications() {
  stopNotifications();
  loadNotifications();
  timer = setInterval(loadNotifications, REFRESH_MS);
}

export function stopNotifications() {
  if (timer) clearInterval(timer);
  timer = null;
}

export function clearNotifications() {
  stopNotifications();
  $("endpoints-rows").replaceChildren();
  $("deliveries-rows").replaceChildren();
  $("notifications-status").textContent = "";
}

async function sendTest(id) {
  const gen = session.generation;
  const status = $("notifications-status");
  status.textContent = `Queuing a test event for ${id}…`;
  let resp;
  try {
    resp = await api(`/v1/webhooks/${encodeURIComponent(id)}/test`, { method: "POST" });
  } catch (e) {
    if (guard(gen, e)) return;
    status.textContent = `Could not queue a test event: ${e.message}`;
    return;
  }
  const body = await resp.json().catch(() => null);
  if (gen !== session.generation) return;
  status.textContent = resp.ok
    ? `Test event ${body.id} queued for ${id}.`
    : `Could not queue a test event: ${body && body.error ? body.error.message : `HTTP ${resp.status}`}`;
  loadNotifications();
}

function rowsOrEmpty(tbody, rows, cols, empty) {
  if (rows.length === 0) rows = [el("tr", { class: "empty-row" }, el("td", { colspan: String(cols), class: "empty", text: empty }))];
  $(tbody).replaceChildren(...rows);
}

async function loadNotifications() {
  const gen = session.generation;
  let v;
  try {
    v = await getJson("/v1/webhooks");
  } catch (e) {
    if (guard(gen, e)) return;
    $("notifications-at").textContent = `Could not refresh: ${e.message}`;
    return;
  }
  if (gen !== session.generation) return;
  rowsOrEmpty("endpoints-rows", v.endpoints.map((e) => {
    const button = el("button", { type: "button", "data-endpoint": e.id, text: "Send test event" });
    button.addEventListener("click", () => sendTest(e.id));
    return el("tr", { "data-endpoint": e.id },
      el("td", { text: e.id }),
      el("td", { text: e.format }),
      el("td", { text: e.events.join(", ") }),
      el("td", { text: String(e.sent) }),
      el("td", { text: String(e.failed) }),
      el("td", { text: String(e.retried) }),
      el("td", { class: e.dead_lettered > 0 ? "health-failing" : null, text: String(e.dead_lettered) }),
      el("td", { text: String(e.outbox.pending) }),
      el("td", { class: e.outbox.dead > 0 ? "health-failing" : null, text: String(e.outbox.dead) }),
      el("td", {}, button));
  }), 10, "No endpoint.");
  rowsOrEmpty("deliveries-rows", v.deliveries.map((d) =>
    el("tr", { "data-id": d.id, "data-state": d.state },
      el("td", { class: "nowrap", text: clock(d.created_at) }),
      el("td", { text: d.endpoint }),
      el("td", { class: "nowrap", text: d.event }),
      el("td", { text: d.client }),
      el("td", { class: `nowrap ${d.state === "dead" ? "health-failing" : d.state === "delivered" ? "health-ok" : ""}`, text: d.state }),
      el("td", { text: String(d.attempts) }),
      el("td", { text: d.last_status == null ? "—" : String(d.last_status) }),
      el("td", { text: d.latency_ms == null ? "—" : `${d.latency_ms} ms` }),
      el("td", { text: d.last_error || "—" }),
      el("td", { class: "id", text: d.id }))), 10, "Nothing sent yet.");
  $("notifications-at").textContent = `Last refreshed ${clock(Math.floor(Date.now() / 1000))}.`;
}
