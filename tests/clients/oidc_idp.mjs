// A real OpenID provider on loopback for the single sign-on tests: `oidc-provider` (the
// certified implementation), served over HTTPS with the test's certificate, with the device
// flow and two users in different groups. A plain-HTTP control listener lets the test rotate
// the signing key, take the provider down, count what the gateway fetched, and get tokens.
//
// Env: IDP_CERT, IDP_KEY (PEM files of a certificate for 127.0.0.1), IDP_CA (the PEM of the
// authority that signed it; default IDP_CERT itself).
// First line on stdout: `listening <https port> <control port>`.
//
// Control (http://127.0.0.1:<control port>):
//   GET  /token?user=alice   a device-flow login of that user (the flow a harness runs),
//                            answered {id_token, access_token, refresh_token}
//   GET  /forged?kid=K       a token of the issuer's shape signed by a key the provider never
//                            had, naming kid K
//   POST /rotate             a new signing key, published first (the old one kept after it)
//   POST /approve?user=bob&code=ABCD-EFGH   the user confirms a device code another client
//                            started (the verification pages: login, consent)
//   POST /redirect?uri=U     the client's redirect URI from now on (a console's callback)
//   POST /disable?user=alice the user no longer exists for the provider (refreshes fail)
//   POST /groups?user=bob&group=developers   the user's groups from now on (next token)
//   POST /down, POST /up     the provider answers 503 to everything, or again serves
//   GET  /stats              {"discovery": n, "jwks": n} requests the HTTPS listener answered

import { generateKeyPairSync, createPrivateKey, sign, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import http from "node:http";
import https from "node:https";
import Provider from "oidc-provider";

const USERS = {
  alice: { name: "Alice", groups: ["developers"] },
  bob: { name: "Bob", groups: ["developers", "approvers"] },
};
const CLIENT = { id: "turnstile", secret: "turnstile-test-client-secret", redirect: "https://127.0.0.1/callback" };

let keys = [signingKey()];
let provider = null;
let down = false;
const stats = { discovery: 0, jwks: 0 };

function signingKey() {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  return { ...privateKey.export({ format: "jwk" }), kid: `k-${randomUUID().slice(0, 8)}`, use: "sig", alg: "ES256" };
}

/** One store shared by every provider instance, so a rotation keeps grants and sessions. */
const STORE = new Map();
class Adapter {
  constructor(name) {
    this.name = name;
  }
  key(id) {
    return `${this.name}:${id}`;
  }
  async upsert(id, payload, expiresIn) {
    STORE.set(this.key(id), { payload, expires: Date.now() + expiresIn * 1000 });
    if (payload.userCode) STORE.set(`userCode:${payload.userCode}`, this.key(id));
    if (payload.uid) STORE.set(`uid:${payload.uid}`, this.key(id));
  }
  async find(id) {
    const e = STORE.get(this.key(id));
    return e && e.expires > Date.now() ? e.payload : undefined;
  }
  async findByUserCode(code) {
    const k = STORE.get(`userCode:${code}`);
    return k ? STORE.get(k)?.payload : undefined;
  }
  async findByUid(uid) {
    const k = STORE.get(`uid:${uid}`);
    return k ? STORE.get(k)?.payload : undefined;
  }
  async consume(id) {
    const e = STORE.get(this.key(id));
    if (e) e.payload.consumed = Math.floor(Date.now() / 1000);
  }
  async destroy(id) {
    STORE.delete(this.key(id));
  }
  async revokeByGrantId(grantId) {
    for (const [k, e] of STORE) if (e && e.payload && e.payload.grantId === grantId) STORE.delete(k);
  }
}

function build(issuer) {
  return new Provider(issuer, {
    adapter: Adapter,
    clients: [
      {
        client_id: CLIENT.id,
        client_secret: CLIENT.secret,
        grant_types: ["urn:ietf:params:oauth:grant-type:device_code", "refresh_token", "authorization_code"],
        response_types: ["code"],
        redirect_uris: [CLIENT.redirect],
        token_endpoint_auth_method: "client_secret_basic",
        id_token_signed_response_alg: "ES256",
      },
    ],
    jwks: { keys },
    features: { deviceFlow: { enabled: true }, devInteractions: { enabled: true } },
    conformIdTokenClaims: false,
    claims: { openid: ["sub"], profile: ["name"], groups: ["groups"] },
    scopes: ["openid", "offline_access", "profile", "groups"],
    async findAccount(ctx, sub) {
      const user = USERS[sub];
      if (!user || user.disabled) return undefined;
      return { accountId: sub, async claims() { return { sub, ...user }; } };
    },
    ttl: { IdToken: 3600, AccessToken: 3600, DeviceCode: 600, Session: 3600, Grant: 3600, Interaction: 600, RefreshToken: 86400 },
  });
}

// ------------------------------------------------------------------ the provider

const tls = { cert: readFileSync(process.env.IDP_CERT), key: readFileSync(process.env.IDP_KEY) };
const server = https.createServer(tls);
await new Promise((r) => server.listen(0, "127.0.0.1", r));
const port = server.address().port;
const ISSUER = `https://127.0.0.1:${port}`;
provider = build(ISSUER);
server.on("request", (req, res) => {
  if (down) {
    res.writeHead(503).end();
    return;
  }
  if (req.url.startsWith("/.well-known/openid-configuration")) stats.discovery++;
  if (req.url.startsWith("/jwks")) stats.jwks++;
  offline(res);
  provider.callback()(req, res);
});

/** The development login pages import a web font: dropped, so a browser test stays on loopback. */
function offline(res) {
  const end = res.end.bind(res);
  res.end = (body, ...rest) => {
    const text = typeof body === "string" ? body : Buffer.isBuffer(body) ? body.toString("utf8") : null;
    if (text && text.includes("fonts.googleapis.com") && !res.headersSent) {
      const out = text.replace(/@import url\(https:\/\/fonts\.googleapis\.com[^)]*\);/g, "");
      res.setHeader("content-length", Buffer.byteLength(out));
      return end(out, ...rest);
    }
    return end(body, ...rest);
  };
}

// The device flow a harness runs, driven over the same HTTPS listener.
const agent = new https.Agent({ ca: readFileSync(process.env.IDP_CA || process.env.IDP_CERT) });
function call(path, { method = "GET", form, jar, basic } = {}) {
  return new Promise((resolve, reject) => {
    const body = form ? new URLSearchParams(form).toString() : undefined;
    const headers = {};
    if (basic) headers.authorization = `Basic ${Buffer.from(`${CLIENT.id}:${CLIENT.secret}`).toString("base64")}`;
    if (body) headers["content-type"] = "application/x-www-form-urlencoded";
    if (jar && jar.size) headers.cookie = [...jar].map(([k, v]) => `${k}=${v}`).join("; ");
    const req = https.request(`${ISSUER}${path}`, { method, headers, agent }, (res) => {
      let text = "";
      res.on("data", (d) => (text += d));
      res.on("end", () => {
        for (const c of res.headers["set-cookie"] || []) {
          const [pair] = c.split(";");
          const i = pair.indexOf("=");
          const [k, v] = [pair.slice(0, i), pair.slice(i + 1)];
          if (jar) {
            if (v === "" || /expires=Thu, 01 Jan 1970/i.test(c)) jar.delete(k);
            else jar.set(k, v);
          }
        }
        resolve({ status: res.statusCode, location: res.headers.location, text });
      });
    });
    req.on("error", reject);
    if (body) req.write(body);
    req.end();
  });
}

const field = (html, name) => {
  const m = html.match(new RegExp(`name="${name}" value="([^"]*)"`));
  return m ? m[1] : undefined;
};
const pathOf = (location) => (location.startsWith("http") ? new URL(location).pathname + new URL(location).search : location);

/** Completes the verification pages of device code `user_code` as `user` (login, consent). */
async function approveDevice(user, user_code) {
  const jar = new Map();
  let page = await call("/device", { jar });
  page = await call("/device", { method: "POST", jar, form: { xsrf: field(page.text, "xsrf"), user_code } });
  let step = await call("/device", { method: "POST", jar, form: { xsrf: field(page.text, "xsrf"), user_code, confirm: "yes" } });
  // Login, then consent, each an interaction page posted back to itself; then the resume.
  for (let hops = 0; hops < 12 && step.location; hops++) {
    const path = pathOf(step.location);
    const got = await call(path, { jar });
    if (got.location) {
      step = got;
      continue;
    }
    if (got.text.includes('name="login"')) {
      step = await call(path, { method: "POST", jar, form: { prompt: "login", login: user, password: "any" } });
    } else if (got.text.includes('name="prompt" value="consent"')) {
      step = await call(path, { method: "POST", jar, form: { prompt: "consent" } });
    } else {
      break;
    }
  }
  return { approved: user_code };
}

async function deviceLogin(user) {
  const scope = "openid offline_access groups profile";
  const start = await call("/device/auth", { method: "POST", basic: true, form: { scope, prompt: "consent" } });
  const { device_code, user_code } = JSON.parse(start.text);
  await approveDevice(user, user_code);
  const grant_type = "urn:ietf:params:oauth:grant-type:device_code";
  const token = await call("/token", { method: "POST", basic: true, form: { grant_type, device_code } });
  if (token.status !== 200) throw new Error(`token endpoint answered ${token.status}: ${token.text}`);
  return JSON.parse(token.text);
}

function forged(kid, user = "alice") {
  const { privateKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const b64 = (v) => Buffer.from(JSON.stringify(v)).toString("base64url");
  const now = Math.floor(Date.now() / 1000);
  const head = `${b64({ alg: "ES256", typ: "JWT", kid })}.${b64({ iss: ISSUER, aud: CLIENT.id, sub: user, iat: now, exp: now + 600 })}`;
  const sig = sign("sha256", Buffer.from(head), { key: createPrivateKey(privateKey.export({ format: "pem", type: "pkcs8" })), dsaEncoding: "ieee-p1363" });
  return `${head}.${sig.toString("base64url")}`;
}

// ------------------------------------------------------------------ control

const control = http.createServer(async (req, res) => {
  const url = new URL(req.url, "http://control");
  const json = (status, v) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(v));
  try {
    if (url.pathname === "/token") return json(200, await deviceLogin(url.searchParams.get("user")));
    if (url.pathname === "/forged") return json(200, { token: forged(url.searchParams.get("kid")) });
    if (url.pathname === "/rotate") {
      keys = [signingKey(), ...keys];
      provider = build(ISSUER);
      return json(200, { kid: keys[0].kid });
    }
    if (url.pathname === "/approve") return json(200, await approveDevice(url.searchParams.get("user"), url.searchParams.get("code")));
    if (url.pathname === "/redirect") {
      CLIENT.redirect = url.searchParams.get("uri");
      provider = build(ISSUER);
      return json(200, { redirect: CLIENT.redirect });
    }
    if (url.pathname === "/disable") {
      const user = USERS[url.searchParams.get("user")];
      if (!user) return json(404, { error: "no such user" });
      user.disabled = true;
      return json(200, user);
    }
    if (url.pathname === "/groups") {
      const user = USERS[url.searchParams.get("user")];
      if (!user) return json(404, { error: "no such user" });
      user.groups = url.searchParams.getAll("group");
      return json(200, user);
    }
    if (url.pathname === "/down") return json(200, { down: (down = true) });
    if (url.pathname === "/up") return json(200, { down: (down = false) });
    if (url.pathname === "/stats") return json(200, stats);
    return json(404, { error: "no such control" });
  } catch (e) {
    return json(500, { error: String(e && e.stack) });
  }
});
await new Promise((r) => control.listen(0, "127.0.0.1", r));
console.log(`listening ${port} ${control.address().port}`);
