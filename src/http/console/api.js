// The gateway's API with the signed-in credential (a bearer header), and the session it
// belongs to. `generation` changes at every sign-out, so loops of an old session stop.

export const session = {
  credential: null,
  me: null,
  generation: 0,
  /** Set by the app: signs out with a message (a 401 anywhere). */
  refused: () => {},
};

export class Unauthorized extends Error {}

export async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  headers.set("authorization", `Bearer ${session.credential}`);
  const resp = await fetch(path, { ...init, headers, cache: "no-store" });
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
