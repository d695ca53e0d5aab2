// Turnstile console: works an approval queue and shows the signed-in principal's activity.
// Everything comes from the gateway's own API with the credential typed into the page, kept in
// this tab's sessionStorage only. Text from the API is only ever set with textContent.
"use strict";

const STORE_KEY = "turnstile.credential";
const BASE_TITLE = "Turnstile console";
const RESYNC_MS = 10000; // pending list re-read (events of other replicas, missed events)
const ACTIVITY_MS = 5000;
const STREAM_IDLE_MS = 45000; // no byte (not even a keep-alive) for this long: reconnect
const SETTLED_LINGER_MS = 120000; // a settled card stays in place this long, unless focused

const $ = (id) => document.getElementById(id);

const state = {
  credential: null,
  me: null,
  cards: new Map(), // approval id -> {record, el, settledAt, seq}
  seq: 0, // arrival order: breaks ties between approvals created in the same second
  stream: null, // AbortController of the events stream
  generation: 0, // bumps on sign-out: stale loops stop
  activityTimer: null,
  confirming: null, // {id, approve}
};

// ---------------------------------------------------------------- API

class Unauthorized extends Error {}

async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  headers.set("authorization", `Bearer ${state.credential}`);
  const resp = await fetch(path, { ...init, headers, cache: "no-store" });
  if (resp.status === 401) throw new Unauthorized();
  return resp;
}

async function getJson(path) {
  const resp = await api(path);
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : `HTTP ${resp.status}`;
    throw new Error(msg);
  }
  return body;
}

// ---------------------------------------------------------------- formatting

const now = () => Math.floor(Date.now() / 1000);

function span(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  return `${h}h ${String(m % 60).padStart(2, "0")}m`;
}

function clock(unix) {
  if (unix == null) return "—";
  return new Date(unix * 1000).toLocaleTimeString([], { hour12: false });
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

// The summary field a card is titled by; the card's details list the others.
const TITLE_KEYS = ["command", "grant_root", "permissions", "message"];

function titleKey(r) {
  const s = r.summary || {};
  return TITLE_KEYS.find((k) => s[k] != null && s[k] !== "");
}

function summaryText(r) {
  const k = titleKey(r);
  return k ? summaryValue(r.summary[k]) : r.kind;
}

const SUMMARY_LABELS = [
  ["command", "Command"],
  ["cwd", "Directory"],
  ["grant_root", "Files under"],
  ["paths", "Files"],
  ["permissions", "Permissions"],
  ["server", "Server"],
  ["message", "Message"],
  ["mode", "Mode"],
  ["backend_reason", "Backend's reason"],
];

function summaryValue(v) {
  if (v == null) return null;
  if (Array.isArray(v)) return v.map(summaryValue).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function summaryList(r) {
  const s = r.summary || {};
  const dl = el("dl");
  const seen = new Set([titleKey(r)]);
  const add = (key, label) => {
    if (seen.has(key)) return;
    seen.add(key);
    const v = summaryValue(s[key]);
    if (v == null || v === "") return;
    dl.append(el("dt", { text: label }), el("dd", { class: key === "command" ? "mono" : null, text: v }));
  };
  for (const [key, label] of SUMMARY_LABELS) add(key, label);
  for (const key of Object.keys(s)) if (!seen.has(key)) add(key, key);
  return dl;
}

function settledText(r, how) {
  const verb = r.state === "approved" ? "Approved" : "Denied";
  const mine = state.me && r.decided_by === state.me.id;
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

// ---------------------------------------------------------------- connection state

function setConn(s, text) {
  const c = $("conn");
  c.dataset.state = s;
  c.textContent = text;
}

// ---------------------------------------------------------------- sign-in

async function signIn(credential, fromStorage) {
  state.credential = credential;
  $("signin-error").textContent = "";
  let me;
  try {
    me = await getJson("/v1/whoami");
  } catch (e) {
    state.credential = null;
    sessionStorage.removeItem(STORE_KEY);
    $("signin-error").textContent = e instanceof Unauthorized
      ? "This key or token was refused."
      : `The gateway could not be reached: ${e.message}`;
    if (fromStorage) showSignIn();
    return;
  }
  sessionStorage.setItem(STORE_KEY, credential);
  state.me = me;
  $("credential").value = "";
  $("who").textContent = `Signed in as ${me.id}${me.approver ? " (approver)" : ""}`;
  $("who").hidden = false;
  $("signout").hidden = false;
  $("signin").hidden = true;
  $("app").hidden = false;
  updateNotifyButton();
  const gen = ++state.generation;
  selectTab("tab-pending", false);
  runEvents(gen);
  resyncLoop(gen);
}

function signOut(message) {
  state.generation++;
  if (state.stream) state.stream.abort();
  state.stream = null;
  state.credential = null;
  state.me = null;
  sessionStorage.removeItem(STORE_KEY);
  for (const c of state.cards.values()) c.el.remove();
  state.cards.clear();
  $("history-rows").replaceChildren();
  for (const id of ["executions-rows", "threads-rows", "usage-rows", "backends-rows"]) $(id).replaceChildren();
  stopActivity();
  if ($("confirm").open) $("confirm").close();
  updateCounts();
  showSignIn();
  $("signin-error").textContent = message || "";
}

function showSignIn() {
  $("app").hidden = true;
  $("signin").hidden = false;
  $("who").hidden = true;
  $("signout").hidden = true;
  $("notify").hidden = true;
  setConn("signed-out", "Signed out");
  $("credential").focus();
}

function guard(gen, e) {
  if (e instanceof Unauthorized && gen === state.generation) {
    signOut("Signed out: the gateway no longer accepts this credential.");
    return true;
  }
  return gen !== state.generation;
}

// ---------------------------------------------------------------- live events

async function runEvents(gen) {
  let backoff = 500;
  setConn("connecting", "Connecting…");
  while (gen === state.generation) {
    try {
      await streamOnce(gen);
      backoff = 500;
    } catch (e) {
      if (guard(gen, e)) return;
    }
    if (gen !== state.generation) return;
    setConn("reconnecting", "Reconnecting…");
    await new Promise((r) => setTimeout(r, backoff));
    backoff = Math.min(backoff * 2, 8000);
  }
}

async function streamOnce(gen) {
  const ctl = new AbortController();
  state.stream = ctl;
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
    if (state.stream === ctl) state.stream = null;
  }
}

function onBlock(block) {
  let data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("data:")) data += line.slice(5).trimStart();
    else if (line.startsWith(": lagged")) resync(state.generation).catch(() => {});
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
  if (gen !== state.generation) return;
  const ids = new Set(list.data.map((r) => r.id));
  // Oldest first, so that arrival order agrees with the list's newest-first order.
  for (const r of [...list.data].reverse()) upsert(r, {});
  // Pending here, no longer pending there: read its settled record.
  for (const [id, c] of state.cards) {
    if (c.record.state !== "pending" || ids.has(id)) continue;
    const resp = await api(`/v1/approvals/${encodeURIComponent(id)}`).catch(() => null);
    if (gen !== state.generation) return;
    if (resp && resp.ok) upsert(await resp.json(), {});
    else if (resp && resp.status === 404) removeCard(id);
  }
}

async function resyncLoop(gen) {
  while (gen === state.generation) {
    await new Promise((r) => setTimeout(r, RESYNC_MS));
    if (gen !== state.generation) return;
    if ($("conn").dataset.state === "live") await resync(gen).catch(() => {});
    pruneSettled();
  }
}

// ---------------------------------------------------------------- pending cards

function upsert(record, { fresh }) {
  const known = state.cards.get(record.id);
  if (known) {
    if (known.record.state !== "pending") return; // settled stays settled
    known.record = record;
    if (record.state !== "pending") settle(known, record, "event");
    return;
  }
  if (record.state !== "pending") return; // settled before this console saw it: History has it
  const card = { record, el: buildCard(record), settledAt: null, seq: ++state.seq };
  card.el.dataset.arrived = fresh ? "event" : "list";
  fillTimers(card, now());
  state.cards.set(record.id, card);
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
    .map((li) => state.cards.get(li.dataset.id))
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
  const card = state.cards.get(id);
  if (!card) return;
  const next = card.el.nextElementSibling || card.el.previousElementSibling;
  card.el.remove();
  state.cards.delete(id);
  if (next && (refocus || !$("pending-list").querySelector('.card[tabindex="0"]'))) {
    rove(next);
    if (refocus) next.focus();
  }
  updateCounts();
}

function pruneSettled() {
  const limit = Date.now() - SETTLED_LINGER_MS;
  for (const [id, c] of state.cards) {
    if (c.settledAt && c.settledAt < limit && !c.el.contains(document.activeElement)) removeCard(id);
  }
}

function pendingCount() {
  let n = 0;
  for (const c of state.cards.values()) if (c.record.state === "pending") n++;
  return n;
}

function updateCounts() {
  const n = pendingCount();
  const count = $("pending-count");
  count.textContent = String(n);
  count.dataset.some = String(n > 0);
  document.title = n > 0 ? `(${n}) ${BASE_TITLE}` : BASE_TITLE;
  $("pending-empty").hidden = state.cards.size > 0;
}

function tick() {
  const t = now();
  for (const c of state.cards.values()) fillTimers(c, t);
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

function onListKey(e) {
  if (e.altKey || e.ctrlKey || e.metaKey) return;
  const li = e.target.closest(".card");
  if (!li) return;
  const cards = cardsInOrder();
  const i = cards.indexOf(li);
  let to = null;
  if (e.key === "ArrowDown") to = cards[Math.min(i + 1, cards.length - 1)];
  else if (e.key === "ArrowUp") to = cards[Math.max(i - 1, 0)];
  else if (e.key === "Home") to = cards[0];
  else if (e.key === "End") to = cards[cards.length - 1];
  else if ((e.key === "a" || e.key === "d") && e.target === li) {
    const card = state.cards.get(li.dataset.id);
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
  const card = state.cards.get(id);
  if (!card || card.record.state !== "pending") return;
  state.confirming = { id, approve };
  const d = $("confirm");
  d.dataset.decision = approve ? "approve" : "deny";
  $("confirm-title").textContent = approve ? "Approve this action?" : "Deny this action?";
  $("confirm-summary").textContent = `${card.record.kind}: ${summaryText(card.record)}`;
  $("confirm-ok").textContent = approve ? "Approve" : "Deny";
  $("confirm-reason").value = "";
  d.showModal();
  (approve ? $("confirm-ok") : $("confirm-reason")).focus();
}

async function confirmDecision(e) {
  e.preventDefault();
  const pick = state.confirming;
  state.confirming = null;
  $("confirm").close();
  if (!pick) return;
  const card = state.cards.get(pick.id);
  if (!card) return;
  card.el.focus();
  const reason = $("confirm-reason").value.trim();
  const body = { decision: pick.approve ? "approve" : "deny" };
  if (reason) body.reason = reason;
  const out = card.el.querySelector(".outcome");
  for (const b of card.el.querySelectorAll("button")) b.disabled = true;
  out.textContent = "Recording the decision…";
  const gen = state.generation;
  try {
    const resp = await api(`/v1/approvals/${encodeURIComponent(pick.id)}/decision`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    const j = await resp.json().catch(() => null);
    if (gen !== state.generation) return;
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

function forceSettle(card, record, how) {
  if (card.record.state !== "pending") {
    // The event got here first; the answer names who decided.
    card.el.querySelector(".outcome").textContent = settledText(record, how);
    return;
  }
  settle(card, record, how);
}

// ---------------------------------------------------------------- notifications

function updateNotifyButton() {
  const b = $("notify");
  b.hidden = !("Notification" in window) || Notification.permission !== "default";
}

async function askNotifications() {
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
      const card = state.cards.get(r.id);
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

// ---------------------------------------------------------------- tabs

const TABS = ["tab-pending", "tab-history", "tab-activity"];

function selectTab(id, focus) {
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
}

function onTabKey(e) {
  const i = TABS.indexOf(e.target.id);
  if (i < 0) return;
  let j = null;
  if (e.key === "ArrowRight") j = (i + 1) % TABS.length;
  else if (e.key === "ArrowLeft") j = (i + TABS.length - 1) % TABS.length;
  else if (e.key === "Home") j = 0;
  else if (e.key === "End") j = TABS.length - 1;
  if (j == null) return;
  e.preventDefault();
  selectTab(TABS[j], true);
}

// ---------------------------------------------------------------- history

async function loadHistory() {
  const gen = state.generation;
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
  if (gen !== state.generation) return;
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
  state.activityTimer = setInterval(loadActivity, ACTIVITY_MS);
}

function stopActivity() {
  if (state.activityTimer) clearInterval(state.activityTimer);
  state.activityTimer = null;
}

function rowsOrEmpty(tbody, rows, cols, empty) {
  if (rows.length === 0) rows = [el("tr", { class: "empty-row" }, el("td", { colspan: String(cols), class: "empty", text: empty }))];
  $(tbody).replaceChildren(...rows);
}

async function loadActivity() {
  const gen = state.generation;
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
  if (gen !== state.generation) return;
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
    const m = perModel.get(r.model) || { requests: 0, input: 0, cached: 0, output: 0, total: 0 };
    m.requests += r.requests;
    m.input += r.input_tokens;
    m.cached += r.cached_input_tokens;
    m.output += r.output_tokens;
    m.total += r.total_tokens;
    perModel.set(r.model, m);
  }
  rowsOrEmpty("usage-rows", [...perModel.entries()].sort().map(([model, m]) =>
    el("tr", { "data-model": model },
      el("td", { text: model }),
      el("td", { text: String(m.requests) }),
      el("td", { text: String(m.input) }),
      el("td", { text: String(m.cached) }),
      el("td", { text: String(m.output) }),
      el("td", { text: String(m.total) }))), 6, "No usage today.");
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

// ---------------------------------------------------------------- start

function start() {
  $("signin-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const v = $("credential").value.trim();
    if (!v) {
      $("signin-error").textContent = "Enter an API key or a JWT.";
      return;
    }
    signIn(v, false);
  });
  $("signout").addEventListener("click", () => signOut("Signed out."));
  $("notify").addEventListener("click", askNotifications);
  $("pending-list").addEventListener("keydown", onListKey);
  for (const t of TABS) $(t).addEventListener("click", () => selectTab(t, false));
  document.querySelector(".tabs").addEventListener("keydown", onTabKey);
  $("history-filters").addEventListener("submit", (e) => {
    e.preventDefault();
    loadHistory();
  });
  $("filter-state").addEventListener("change", loadHistory);
  $("filter-reason").addEventListener("change", loadHistory);
  $("confirm-form").addEventListener("submit", confirmDecision);
  $("confirm-cancel").addEventListener("click", () => $("confirm").close());
  $("confirm").addEventListener("close", () => {
    const pick = state.confirming;
    state.confirming = null;
    const card = pick && state.cards.get(pick.id);
    if (card) card.el.focus();
  });
  setInterval(tick, 1000);
  const saved = sessionStorage.getItem(STORE_KEY);
  if (saved) signIn(saved, true);
  else showSignIn();
}

start();
