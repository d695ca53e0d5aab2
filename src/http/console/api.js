// The gateway's API with the signed-in credential (a bearer header), or, signed in through
// the identity provider, the session cookie (sent by the browser) beside its CSRF token, and
// the session it belongs to. `generation` changes at every sign-out, so loops of an old
// session stop.

export const session = {
  credential: null,
  /** The CSRF token of a provider sign-in (its cookie is HttpOnly); null otherwise. */
  csrf: null,
  me: null,
  generation: 0,
  /** Set by the app: signs out with a message (a 401 anywhere). */
  refused: () => {},
};

export class Unauthorized extends Error {}

export async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  if (session.csrf) headers.set("x-turnstile-csrf", session.csrf);
  else headers.set("authorization", `Bearer ${session.credential}`);
  const resp = await fetch(path, { ...init, headers, cache: "no-store", credentials: "same-origin" });
  if (resp.status === 401) throw new Unauthorized();
  return resp;
}

export async function getJson(path) {
  const resp = await api(path);
  const body = await resp.json().catch(() => null);
  if (!resp.ok) {
    const msg = body && body.error ? body.error.message : `HTTP ${resp.status}`;
    throw new Error(msg);
  }
  return body;
}

export function guard(gen, e) {
  if (e instanceof Unauthorized && gen === session.generation) {
    session.refused("Signed out: the gateway no longer accepts this credential.");
    return true;
  }
  return gen !== session.generation;
}
