// The approval queue: pending approvals live from the event stream (re-read on every
// (re)connect and every RESYNC_MS), their cards, keyboard moves, confirmations, decisions and
// notifications.

import { api, getJson, guard, session } from "./api.js";
import { $, el, now, setConn, span, summaryList, summaryText } from "./dom.js";
import { selectTab } from "./views.js";

const BASE_TITLE = "Turnstile console";
const RESYNC_MS = 10000; // pending list re-read (events of other replicas, missed events)
const STREAM_IDLE_MS = 45000; // no byte (not even a keep-alive) for this long: reconnect
const SETTLED_LINGER_MS = 120000; // a settled card stays in place this long, unless focused

const cards = new Map(); // approval id -> {record, el, settledAt, seq}
let seq = 0; // arrival order: breaks ties between approvals created in the same second
let stream = null; // AbortController of the events stream
let confirming = null; // {id, approve}

/** Starts the queue of a new session. */
export function startQueue(gen) {
  runEvents(gen);
  resyncLoop(gen);
}

/** Ends the queue of a session: the stream, every card, an open confirmation. */
export function stopQueue() {
  if (stream) stream.abort();
  stream = null;
  for (const c of cards.values()) c.el.remove();
  cards.clear();
  if ($("confirm").open) $("confirm").close();
  updateCounts();
}

function settledText(r, how) {
  const verb = r.state === "approved" ? "Approved" : "Denied";
  const mine = session.me && r.decided_by === session.me.id;
  if (r.reason === "human") {
    const by = mine ? `you (${r.decided_by})` : r.decided_by;
    const given = r.decision_reason ? ` Reason: ${r.decision_reason}` : "";
    if (how === "raced") return `Already decided by ${by}: ${r.state}.${given}`;
    return `${verb} by ${by}.${given}`;
  }
  const why = {
    expired: "it expired before anyone decided",
    cancelled: "its execution ended",
    orphaned: "its gateway process went away",
    store_unavailable: "the decision could not be recorded",
  }[r.reason] || r.reason;
  return `${verb}: ${why}.`;
}

// ---------------------------------------------------------------- live events

async function runEvents(gen) {
  let backoff = 500;
  setConn("connecting", "Connecting…");
  while (gen === session.generation) {
    try {
      await streamOnce(gen);
      backoff = 500;
    } catch (e) {
      if (guard(gen, e)) return;
    }
    if (gen !== session.generation) return;
    setConn("reconnecting", "Reconnecting…");
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 8000);
  }
}

async function streamOnce(gen) {
  const ctl = new AbortController();
  stream = ctl;
  let watchdog = setTimeout(() => ctl.abort(), STREAM_IDLE_MS);
  try {
    const resp = await api("/v1/approvals/events", { signal: ctl.signal });
    if (!resp.ok || !resp.body) throw new Error(`HTTP ${resp.status}`);
    // Subscribed: what happened before is read now, what happens next arrives as events.
    await resync(gen);
    setConn("live", "Live");
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      clearTimeout(watchdog);
      watchdog = setTimeout(() => ctl.abort(), STREAM_IDLE_MS);
      buf += value.replace(/\r\n/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        onBlock(block);
      }
    }
  } finally {
    clearTimeout(watchdog);
    if (stream === ctl) stream = null;
  }
}

function onBlock(block) {
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("data:")) data += line.slice(5).trimStart();
    else if (line.startsWith(": lagged")) resync(session.generation).catch(() => {});
  }
  if (!data) return;
  let ev;
  try {
    ev = JSON.parse(data);
  } catch {
    return;
  }
  if (!ev.approval) return;
  if (ev.type === "created") upsert(ev.approval, { fresh: true });
  else upsert(ev.approval, {});
}

async function resync(gen) {
  let list;
  try {
    list = await getJson("/v1/approvals?state=pending");
  } catch (e) {
    if (guard(gen, e)) return;
    throw e;
  }
  if (gen !== session.generation) return;
  const ids = new Set(list.data.map((r) => r.id));
  // Oldest first, so that arrival order agrees with the list's newest-first order.
  for (const r of [...list.data].reverse()) upsert(r, {});
  // Pending here, no longer pending there: read its settled record.
  for (const [id, c] of cards) {
    if (c.record.state !== "pending" || ids.has(id)) continue;
    const resp = await api(`/v1/approvals/${encodeURIComponent(id)}`).catch(() => null);
    if (gen !== session.generation) return;
    if (resp && resp.ok) upsert(await resp.json(), {});
    else if (resp && resp.status === 404) removeCard(id);
  }
}

async function resyncLoop(gen) {
  while (gen === session.generation) {
    await new Promise((r) => setTimeout(r, RESYNC_MS));
    if (gen !== session.generation) return;
    if ($("conn").dataset.state === "live") await resync(gen).catch(() => {});
    pruneSettled();
  }
}

// ---------------------------------------------------------------- pending cards

function upsert(record, { fresh }) {
  const known = cards.get(record.id);
  if (known) {
    if (known.record.state !== "pending") return; // settled stays settled
    known.record = record;
    if (record.state !== "pending") settle(known, record, "event");
    return;
  }
  if (record.state !== "pending") return; // settled before this console saw it: History has it
  const card = { record, el: buildCard(record), settledAt: null, seq: ++seq };
  card.el.dataset.arrived = fresh ? "event" : "list";
  fillTimers(card, now());
  cards.set(record.id, card);
  insertNewestFirst(card);
  updateCounts();
  if (fresh) {
    announce(`New approval from ${record.client}: ${record.kind} ${summaryText(record)}`);
    notifyNew(record);
  }
}

// Screen readers hear arrivals and decisions without the focus moving.
function announce(text) {
  $("announce").textContent = text;
}

function buildCard(r) {
  const title = el("p", { class: "card-title mono", text: summaryText(r) });
  title.id = `title-${r.id}`;
  const age = el("span", { class: "timer age" });
  const expiry = el("span", { class: "timer expiry" });
  const approve = el("button", { class: "approve", type: "button", text: "Approve" });
  const deny = el("button", { class: "deny", type: "button", text: "Deny" });
  approve.setAttribute("aria-describedby", title.id);
  deny.setAttribute("aria-describedby", title.id);
  approve.addEventListener("click", () => askConfirm(r.id, true));
  deny.addEventListener("click", () => askConfirm(r.id, false));
  const outcome = el("p", { class: "outcome", role: "status" });
  const li = el(
    "li",
    { class: "card", tabindex: "-1", "data-id": r.id, "data-state": "pending", "aria-labelledby": title.id },
    el("div", { class: "card-head" },
      el("span", { class: "kind", text: r.kind.replace("_", " ") }),
      title),
    summaryList(r),
    el("div", { class: "card-meta" },
      el("span", { text: `client ${r.client}` }),
      el("span", { text: `model ${r.model}` }),
      el("span", { class: "id", text: r.execution_id }),
      age,
      expiry),
    el("div", { class: "card-actions" }, approve, deny, outcome),
  );
  li.addEventListener("focus", () => rove(li));
  return li;
}

function insertNewestFirst(card) {
  const list = $("pending-list");
  const focused = document.activeElement && list.contains(document.activeElement) ? document.activeElement : null;
  const anchor = focused || (window.scrollY > 0 ? firstVisibleCard() : null);
  const before = anchor ? anchor.getBoundingClientRect().top : 0;
  const newer = (x, y) => x.record.created_at > y.record.created_at
    || (x.record.created_at === y.record.created_at && x.seq > y.seq);
  // The list is newest first: the new card goes before the first one older than it.
  const older = [...list.children]
    .map((li) => cards.get(li.dataset.id))
    .find((c) => c && newer(card, c));
  list.insertBefore(card.el, older ? older.el : null);
  // What the approver is looking at or about to press stays where it was.
  if (anchor) window.scrollBy(0, anchor.getBoundingClientRect().top - before);
  // Tabbing into the list lands on the newest, unless the approver is working in it.
  if (!focused) rove(list.firstElementChild);
}

function firstVisibleCard() {
  return [...$("pending-list").children].find((c) => c.getBoundingClientRect().bottom > 0) || null;
}

function settle(card, record, how) {
  card.record = record;
  card.settledAt = Date.now();
  const li = card.el;
  li.dataset.state = record.state;
  for (const b of li.querySelectorAll("button")) b.disabled = true;
  li.querySelector(".expiry").textContent = "";
  li.querySelector(".outcome").textContent = settledText(record, how);
  if (how === "event") announce(`${summaryText(record)}: ${settledText(record, how)}`);
  const dismiss = el("button", { class: "dismiss", type: "button", text: "Dismiss" });
  dismiss.addEventListener("click", () => removeCard(record.id, true));
  li.querySelector(".card-actions").append(dismiss);
  updateCounts();
}

function removeCard(id, refocus) {
  const card = cards.get(id);
  if (!card) return;
  const next = card.el.nextElementSibling || card.el.previousElementSibling;
  card.el.remove();
  cards.delete(id);
  if (next && (refocus || !$("pending-list").querySelector('.card[tabindex="0"]'))) {
    rove(next);
    if (refocus) next.focus();
  }
  updateCounts();
}

function pruneSettled() {
  const limit = Date.now() - SETTLED_LINGER_MS;
  for (const [id, c] of cards) {
    if (c.settledAt && c.settledAt < limit && !c.el.contains(document.activeElement)) removeCard(id);
  }
}

function pendingCount() {
  let n = 0;
  for (const c of cards.values()) if (c.record.state === "pending") n++;
  return n;
}

function updateCounts() {
  const n = pendingCount();
  const count = $("pending-count");
  count.textContent = String(n);
  count.dataset.some = String(n > 0);
  document.title = n > 0 ? `(${n}) ${BASE_TITLE}` : BASE_TITLE;
  $("pending-empty").hidden = cards.size > 0;
}

export function tick() {
  const t = now();
  for (const c of cards.values()) fillTimers(c, t);
}

function fillTimers(c, t) {
  const r = c.record;
  c.el.querySelector(".age").textContent = `asked ${span(t - r.created_at)} ago`;
  if (r.state === "pending") {
    const left = r.expires_at - t;
    const exp = c.el.querySelector(".expiry");
    exp.textContent = `expires in ${span(left)}`;
    exp.dataset.soon = String(left < 60);
  }
}

// ---------------------------------------------------------------- keyboard

function cardsInOrder() {
  return [...$("pending-list").querySelectorAll(".card")];
}

function rove(li) {
  for (const c of cardsInOrder()) c.tabIndex = c === li ? 0 : -1;
}

export function onListKey(e) {
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  const li = e.target.closest(".card");
  if (!li) return;
  const order = cardsInOrder();
  const i = order.indexOf(li);
  let to = null;
  if (e.key === "ArrowDown") to = order[Math.min(i + 1, order.length - 1)];
  else if (e.key === "ArrowUp") to = order[Math.max(i - 1, 0)];
  else if (e.key === "Home") to = order[0];
  else if (e.key === "End") to = order[order.length - 1];
  else if ((e.key === "a" || e.key === "d") && e.target === li) {
    const card = cards.get(li.dataset.id);
    if (card && card.record.state === "pending") askConfirm(card.record.id, e.key === "a");
    e.preventDefault();
    return;
  }
  if (to) {
    e.preventDefault();
    rove(to);
    to.focus();
  }
}

// ---------------------------------------------------------------- decide

function askConfirm(id, approve) {
  const card = cards.get(id);
  if (!card || card.record.state !== "pending") return;
  confirming = { id, approve };
  const d = $("confirm");
  d.dataset.decision = approve ? "approve" : "deny";
  $("confirm-title").textContent = approve ? "Approve this action?" : "Deny this action?";
  $("confirm-summary").textContent = `${card.record.kind}: ${summaryText(card.record)}`;
  $("confirm-ok").textContent = approve ? "Approve" : "Deny";
  $("confirm-reason").value = "";
  d.showModal();
  (approve ? $("confirm-ok") : $("confirm-reason")).focus();
}

export async function confirmDecision(e) {
  e.preventDefault();
  const pick = confirming;
  confirming = null;
  $("confirm").close();
  if (!pick) return;
  const card = cards.get(pick.id);
  if (!card) return;
  card.el.focus();
  const reason = $("confirm-reason").value.trim();
  const body = { decision: pick.approve ? "approve" : "deny" };
  if (reason) body.reason = reason;
  const out = card.el.querySelector(".outcome");
  for (const b of card.el.querySelectorAll("button")) b.disabled = true;
  out.textContent = "Recording the decision…";
  const gen = session.generation;
  try {
    const resp = await api(`/v1/approvals/${encodeURIComponent(pick.id)}/decision`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const j = await resp.json().catch(() => null);
    if (gen !== session.generation) return;
    if (resp.ok) return forceSettle(card, j, "mine");
    if (resp.status === 409 && j && j.approval) return forceSettle(card, j.approval, "raced");
    if (resp.status === 404) {
      out.textContent = "This approval is no longer visible to you.";
      return;
    }
    out.textContent = `Not recorded: ${j && j.error ? j.error.message : `HTTP ${resp.status}`}`;
  } catch (err) {
    if (guard(gen, err)) return;
    out.textContent = `Not recorded: ${err.message}`;
  }
  if (card.record.state === "pending") for (const b of card.el.querySelectorAll("button")) b.disabled = false;
}

/** The confirmation closed without a decision: the focus goes back to its card. */
export function confirmClosed() {
  const pick = confirming;
  confirming = null;
  const card = pick && cards.get(pick.id);
  if (card) card.el.focus();
}

function forceSettle(card, record, how) {
  if (card.record.state !== "pending") {
    // The event got here first; the answer names who decided.
    card.el.querySelector(".outcome").textContent = settledText(record, how);
    return;
  }
  settle(card, record, how);
}

// ---------------------------------------------------------------- notifications

export function updateNotifyButton() {
  const b = $("notify");
  b.hidden = !("Notification" in window) || Notification.permission !== "default";
}

export async function askNotifications() {
  if (!("Notification" in window)) return;
  await Notification.requestPermission();
  updateNotifyButton();
}

function notifyNew(r) {
  if (!("Notification" in window) || Notification.permission !== "granted") return;
  try {
    const n = new Notification("Approval requested", {
      body: `${r.client} · ${r.kind}: ${summaryText(r)}`,
      tag: r.id,
    });
    n.onclick = () => {
      window.focus();
      const card = cards.get(r.id);
      if (card) {
        selectTab("tab-pending", true);
        rove(card.el);
        card.el.focus();
      }
    };
  } catch {
    // Some platforms allow notifications only from a service worker: the badge still counts.
  }
}
