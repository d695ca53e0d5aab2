// Small DOM and formatting helpers of the console. Text from the API goes in as text only.

export const $ = (id) => document.getElementById(id);

export const now = () => Math.floor(Date.now() / 1000);

export function span(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  return `${h}h ${String(m % 60).padStart(2, "0")}m`;
}

export function clock(unix) {
  if (unix == null) return "—";
  return new Date(unix * 1000).toLocaleTimeString([], { hour12: false });
}

export function el(tag, attrs = {}, ...children) {
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

export function summaryText(r) {
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

export function summaryValue(v) {
  if (v == null) return null;
  if (Array.isArray(v)) return v.map(summaryValue).join(", ");
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function summaryList(r) {
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

export function setConn(s, text) {
  const c = $("conn");
  c.dataset.state = s;
  c.textContent = text;
}
