// Turnstile console: works an approval queue and shows the signed-in principal's activity.
// Everything comes from the gateway's own API, either with the credential typed into the page
// (kept in this tab's sessionStorage only) or, signed in through the identity provider, with
// the gateway's HttpOnly session cookie and its CSRF token. Text from the API is only ever set
// with textContent.

import { getJson, session, Unauthorized } from "./api.js";
import { $, setConn } from "./dom.js";
import {
  askNotifications, confirmClosed, confirmDecision, onListKey, startQueue, stopQueue, tick,
  updateNotifyButton,
} from "./queue.js";
import { notificationsAvailable } from "./notifications.js";
import { clearViews, loadHistory, onTabKey, selectTab, TABS } from "./views.js";

const STORE_KEY = "turnstile.credential";

async function signIn(credential, fromStorage, csrf = null) {
  session.credential = credential;
  session.csrf = csrf;
  $("signin-error").textContent = "";
  let me;
  try {
    me = await getJson("/v1/whoami");
  } catch (e) {
    session.credential = null;
    session.csrf = null;
    sessionStorage.removeItem(STORE_KEY);
    $("signin-error").textContent = e instanceof Unauthorized
      ? "This key or token was refused."
      : `The gateway could not be reached: ${e.message}`;
    if (fromStorage) showSignIn();
    return;
  }
  if (credential) sessionStorage.setItem(STORE_KEY, credential);
  session.me = me;
  $("credential").value = "";
  $("who").textContent = `Signed in as ${me.id}${me.approver ? " (approver)" : ""}`;
  $("who").hidden = false;
  $("signout").hidden = false;
  $("signin").hidden = true;
  $("app").hidden = false;
  updateNotifyButton();
  const gen = ++session.generation;
  selectTab("tab-pending", false);
  startQueue(gen);
  const notifications = await notificationsAvailable();
  if (gen === session.generation) $("tab-notifications").hidden = !notifications;
}

function signOut(message) {
  session.generation++;
  // A provider sign-in ends at the gateway too (its cookie cleared, its session revoked).
  if (session.csrf) {
    const csrf = session.csrf;
    fetch("/console/sso/logout", { method: "POST", headers: { "x-turnstile-csrf": csrf }, credentials: "same-origin" })
      .catch(() => {});
  }
  session.csrf = null;
  session.credential = null;
  session.me = null;
  sessionStorage.removeItem(STORE_KEY);
  stopQueue();
  clearViews();
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

function start() {
  session.refused = signOut;
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
  $("confirm").addEventListener("close", confirmClosed);
  setInterval(tick, 1000);
  resume();
}

/** Offers the providers (and the key form unless switched off), then resumes a provider
 * sign-in the cookie still holds, or a pasted credential this tab kept. */
async function resume() {
  try {
    const r = await fetch("/console/sso/providers", { cache: "no-store" });
    const p = await r.json();
    $("signin-form").hidden = !p.api_key_sign_in;
    $("signin-key-hint").hidden = !p.api_key_sign_in;
    const list = $("providers");
    list.replaceChildren();
    for (const prov of p.providers || []) {
      const a = document.createElement("a");
      a.className = "button primary";
      a.href = `/console/sso/start?issuer=${encodeURIComponent(prov.issuer)}`;
      a.textContent = `Sign in with ${new URL(prov.issuer).host}`;
      const li = document.createElement("li");
      li.append(a);
      list.append(li);
    }
    list.hidden = !(p.providers || []).length;
  } catch (e) {
    // The key form stays.
  }
  try {
    const r = await fetch("/console/sso/session", { cache: "no-store", credentials: "same-origin" });
    if (r.ok) {
      const s = await r.json();
      return signIn(null, true, s.csrf);
    }
  } catch (e) {
    // Not signed in through a provider.
  }
  const saved = sessionStorage.getItem(STORE_KEY);
  if (saved) signIn(saved, true);
  else showSignIn();
}

start();
