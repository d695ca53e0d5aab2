//! `[[auth.jwt]]`: each trusted issuer is validated, its key files are read through the
//! caller's reader and checked by `auth::jwt`, and it becomes a frozen [`JwtIssuer`].

use std::path::Path;
use std::sync::Arc;

use jsonwebtoken::Algorithm;

use super::raw::{RawJwt, RawOidc};
use super::validate::{limits, models_allowed, roles};
use super::{err, resolve, ConfigError, JwtIssuer};
use crate::auth::jwt::{family_name, jwks_keys, parse_algorithm, pem_keys, Keys};
use crate::auth::oidc::{Remote, SignIn};

/// The most clock skew an issuer may be granted.
const MAX_LEEWAY_SECONDS: u64 = 300;

/// The shortest `refresh_seconds` of an `[[auth.oidc]]` provider.
const MIN_REFRESH_SECONDS: u64 = 1;

/// `[[auth.jwt]]` and `[[auth.oidc]]`: validates each issuer and reads its key files (and an
/// OpenID provider's `ca_file`) through `read`. A provider's keys are fetched later, by the
/// engine: here its entry gets an empty [`Remote`].
pub(super) fn jwt_issuers(
    raw: Vec<RawJwt>,
    oidc: Vec<RawOidc>,
    base: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Vec<Arc<JwtIssuer>>, ConfigError> {
    let mut out: Vec<Arc<JwtIssuer>> = Vec::new();
    let entries = (raw
        .into_iter()
        .enumerate()
        .map(|(i, j)| (format!("auth.jwt[{i}]"), j, None)))
    .chain(
        oidc.into_iter()
            .enumerate()
            .map(|(i, o)| (format!("auth.oidc[{i}]"), o.rules(), Some(o))),
    );
    for (section, j, provider) in entries {
        let at = |k: &str| format!("{section}.{k}");
        if j.issuer.is_empty() || j.issuer.contains('#') || j.issuer.chars().any(char::is_control) {
            return Err(err(
                at("issuer"),
                "must be non-empty, without `#` or control characters",
            ));
        }
        if out.iter().any(|o| o.issuer == j.issuer) {
            return Err(err(
                at("issuer"),
                format!("duplicate issuer `{}`", j.issuer),
            ));
        }
        if j.audiences.is_empty() {
            return Err(err(at("audiences"), "must name at least one audience"));
        }
        if let Some(k) = j.audiences.iter().position(String::is_empty) {
            return Err(err(
                format!("{section}.audiences[{k}]"),
                "must not be empty",
            ));
        }
        if j.algorithms.is_empty() {
            return Err(err(
                at("algorithms"),
                "must name at least one algorithm, e.g. [\"RS256\"]",
            ));
        }
        let mut algorithms: Vec<Algorithm> = Vec::new();
        for (k, name) in j.algorithms.iter().enumerate() {
            let alg =
                parse_algorithm(name).map_err(|m| err(format!("{section}.algorithms[{k}]"), m))?;
            if let Some(first) = algorithms.first() {
                if first.family() != alg.family() {
                    return Err(err(
                        format!("{section}.algorithms[{k}]"),
                        format!(
                            "`{name}` is {} but `{}` is {}: one issuer's algorithms share one key family",
                            family_name(alg.family()),
                            j.algorithms[0],
                            family_name(first.family())
                        ),
                    ));
                }
            }
            if !algorithms.contains(&alg) {
                algorithms.push(alg);
            }
        }
        let family = algorithms[0].family();
        let load = |key: &str, file: &str| -> Result<Vec<u8>, ConfigError> {
            let path = resolve(base, file);
            read(&path).map_err(|e| err(at(key), format!("cannot read {}: {e}", path.display())))
        };
        let keys = match (&j.pem_file, &j.jwks_file) {
            _ if provider.is_some() => {
                let o = provider.as_ref().expect("an OpenID provider");
                let ca = o
                    .ca_file
                    .as_deref()
                    .map(|f| load("ca_file", f))
                    .transpose()?;
                remote(o, &at, &algorithms, ca)?
            }
            (Some(_), Some(_)) => {
                return Err(err(
                    at("jwks_file"),
                    "set either pem_file or jwks_file, not both",
                ))
            }
            (None, None) => {
                return Err(err(
                    at("pem_file"),
                    "missing: set pem_file (a public key PEM) or jwks_file (a JWKS file)",
                ))
            }
            (Some(f), None) => {
                pem_keys(&load("pem_file", f)?, family).map_err(|m| err(at("pem_file"), m))?
            }
            (None, Some(f)) => jwks_keys(&load("jwks_file", f)?, family, &algorithms)
                .map_err(|m| err(at("jwks_file"), m))?,
        };
        if j.leeway_seconds > MAX_LEEWAY_SECONDS {
            return Err(err(
                at("leeway_seconds"),
                format!("must be at most {MAX_LEEWAY_SECONDS}"),
            ));
        }
        if let Some(k) = j.require.iter().position(String::is_empty) {
            return Err(err(format!("{section}.require[{k}]"), "must not be empty"));
        }
        if j.typ.as_deref() == Some("") {
            return Err(err(
                at("typ"),
                "must not be empty (leave it out to accept any)",
            ));
        }
        if j.groups_claim.is_empty() || j.groups_claim.split('.').any(str::is_empty) {
            return Err(err(
                at("groups_claim"),
                "must name a claim (`groups`, or a path such as `realm_access.roles`)",
            ));
        }
        let models = models_allowed(&j.models, &at("models"))?;
        let roles = roles(&j.roles, &at("roles"))?;
        let limits = limits(
            &section,
            j.requests_per_minute,
            j.burst,
            j.concurrent_executions,
            j.max_suspended,
            j.max_streams,
            j.budget.as_ref(),
        )?;
        out.push(Arc::new(JwtIssuer {
            issuer: j.issuer,
            audiences: j.audiences,
            algorithms,
            keys,
            leeway_seconds: j.leeway_seconds,
            require: j.require,
            typ: j.typ,
            groups_claim: j.groups_claim,
            models,
            roles,
            limits,
        }));
    }
    Ok(out)
}

/// An OpenID provider's keys, to fetch: its issuer must be an `https` URL, its refresh and
/// key age sensible, its `ca_file` readable.
fn remote(
    o: &RawOidc,
    at: &dyn Fn(&str) -> String,
    algorithms: &[Algorithm],
    ca: Option<Vec<u8>>,
) -> Result<Keys, ConfigError> {
    let url = reqwest::Url::parse(&o.issuer).map_err(|e| err(at("issuer"), e.to_string()))?;
    if url.scheme() != "https"
        || url.host().is_none()
        || url.query().is_some()
        || url.fragment().is_some()
    {
        return Err(err(
            at("issuer"),
            "must be an https URL without query or fragment (what the provider's tokens say in `iss`)",
        ));
    }
    if o.refresh_seconds < MIN_REFRESH_SECONDS {
        return Err(err(
            at("refresh_seconds"),
            format!("must be at least {MIN_REFRESH_SECONDS}"),
        ));
    }
    if o.max_key_age_seconds < o.refresh_seconds {
        return Err(err(
            at("max_key_age_seconds"),
            "must be at least refresh_seconds (else good keys would age out between two fetches)",
        ));
    }
    let ca_pem = match ca {
        Some(pem) => match reqwest::Certificate::from_pem_bundle(&pem) {
            Ok(certs) if !certs.is_empty() => Some(pem),
            _ => return Err(err(at("ca_file"), "holds no PEM certificate")),
        },
        None => None,
    };
    Ok(Keys::Remote(Arc::new(Remote::new(
        o.issuer.clone(),
        algorithms.to_vec(),
        ca_pem,
        std::time::Duration::from_secs(o.refresh_seconds),
        std::time::Duration::from_secs(o.max_key_age_seconds),
        sign_in(o, at)?,
    ))))
}

/// Sign-in through the provider, when `client_id` is set: the provider's ID tokens for the
/// gateway name it in `aud`, so it must be one of `audiences`.
fn sign_in(o: &RawOidc, at: &dyn Fn(&str) -> String) -> Result<Option<SignIn>, ConfigError> {
    let Some(client_id) = &o.client_id else {
        if o.client_secret_env.is_some() {
            return Err(err(at("client_secret_env"), "needs client_id beside it"));
        }
        return Ok(None);
    };
    if client_id.is_empty() || !o.audiences.contains(client_id) {
        return Err(err(
            at("client_id"),
            "must be one of audiences (the provider's ID tokens for the gateway name it in `aud`)",
        ));
    }
    if o.client_secret_env.as_deref() == Some("") {
        return Err(err(at("client_secret_env"), "must name a variable"));
    }
    if !o.scopes.iter().any(|s| s == "openid") {
        return Err(err(at("scopes"), "must contain `openid`"));
    }
    if !(1..=86_400).contains(&o.token_ttl_seconds) {
        return Err(err(at("token_ttl_seconds"), "must be 1 to 86400"));
    }
    if o.session_ttl_seconds < o.token_ttl_seconds {
        return Err(err(
            at("session_ttl_seconds"),
            "must be at least token_ttl_seconds",
        ));
    }
    Ok(Some(SignIn {
        client_id: client_id.clone(),
        client_secret_env: o.client_secret_env.clone(),
        scopes: o.scopes.clone(),
        token_ttl: std::time::Duration::from_secs(o.token_ttl_seconds),
        session_ttl: std::time::Duration::from_secs(o.session_ttl_seconds),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{jwt_toml, parse_jwt, ISSUER};
    use jsonwebtoken::Algorithm;

    const PROVIDER: &str = r#"
[[auth.oidc]]
issuer = "https://login.example.com/tenant"
audiences = ["turnstile"]
models = ["*"]
"#;

    #[test]
    fn an_openid_provider_gets_keys_to_fetch_and_checked_settings() {
        let cfg = parse_jwt(&jwt_toml(PROVIDER, "")).unwrap();
        let i = &cfg.jwt[0];
        assert_eq!(i.algorithms, vec![Algorithm::RS256], "the default");
        let crate::auth::jwt::Keys::Remote(r) = &i.keys else {
            panic!("keys to fetch")
        };
        assert_eq!(r.refresh.as_secs(), 3600);
        assert_eq!(r.max_key_age.as_secs(), 86_400);
        assert!(r.current(0).is_none(), "nothing fetched at load");
        for (bad, path) in [
            (
                "issuer = \"http://login.example.com\"",
                "auth.oidc[0].issuer",
            ),
            (
                "issuer = \"https://login.example.com/?q\"",
                "auth.oidc[0].issuer",
            ),
            ("refresh_seconds = 0", "auth.oidc[0].refresh_seconds"),
            (
                "max_key_age_seconds = 60",
                "auth.oidc[0].max_key_age_seconds",
            ),
            ("ca_file = \"keys/idp.pem\"", "auth.oidc[0].ca_file"),
            ("ca_file = \"missing.pem\"", "auth.oidc[0].ca_file"),
            ("pem_file = \"keys/idp.pem\"", ""),
        ] {
            let key = bad.split(' ').next().unwrap();
            let text = PROVIDER
                .lines()
                .filter(|l| key != "issuer" || !l.starts_with("issuer"))
                .collect::<Vec<_>>()
                .join("\n");
            let e = parse_jwt(&jwt_toml(&format!("{text}\n{bad}\n"), "")).unwrap_err();
            assert!(e.path.starts_with(path), "{bad}: {e}");
        }
        // One issuer is trusted one way.
        let both = format!(
            "{ISSUER}{}",
            PROVIDER.replace("https://login.example.com/tenant", "https://idp.test")
        );
        let e = parse_jwt(&jwt_toml(&both, "")).unwrap_err();
        assert_eq!(e.path, "auth.oidc[0].issuer", "{e}");
    }

    #[test]
    fn groups_grant_their_members_models_roles_and_tightest_limits() {
        let groups = r#"
    [[groups]]
    name = "developers"
    models = ["demo*"]
    concurrent_executions = 2
    budget = { usd_per_day = 10.0 }
    [[groups]]
    name = "approvers"
    roles = ["approver"]
    "#;
        let cfg = parse_jwt(&jwt_toml(&format!("{ISSUER}{groups}"), "")).unwrap();
        assert_eq!(cfg.jwt[0].groups_claim, "groups", "the default");
        let sam = "jwt:https://idp.test#sam";
        let alone = cfg.grant(sam, &[]).unwrap();
        assert!(!alone.may_use("demo") && !alone.approver());
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let dev = cfg.grant(sam, &names(&["developers", "unknown"])).unwrap();
        assert!(dev.may_use("demo") && !dev.approver());
        assert_eq!(dev.limits().concurrent_executions, Some(2));
        assert_eq!(dev.limits().budget.usd_per_day, None, "pooled, not its own");
        assert_eq!(dev.pools().count(), 1);
        assert!(cfg.grant(sam, &names(&["approvers"])).unwrap().approver());
        assert_eq!(
            cfg.budget_of("group:developers").usd_per_day,
            Some(crate::budget::nanos(10.0))
        );
        assert_eq!(
            cfg.budget_of("group:none"),
            crate::budget::Budget::default()
        );

        for (bad, path) in [
            ("[[groups]]\nname = \"\"\n", "groups[0].name"),
            (
                "[[groups]]\nname = \"a\"\n[[groups]]\nname = \"a\"\n",
                "groups[1].name",
            ),
            (
                "[[groups]]\nname = \"a\"\nroles = [\"root\"]\n",
                "groups[0].roles[0]",
            ),
            ("[[groups]]\nname = \"a\"\nburst = 2\n", "groups[0].burst"),
            ("[[groups]]\nname = \"a\"\nmembers = []\n", ""),
        ] {
            let e = parse_jwt(&jwt_toml(&format!("{ISSUER}{bad}"), "")).unwrap_err();
            assert!(e.path.starts_with(path), "{bad}: {e}");
        }
        let e =
            parse_jwt(&jwt_toml(&format!("{ISSUER}groups_claim = \"a..b\"\n"), "")).unwrap_err();
        assert_eq!(e.path, "auth.jwt[0].groups_claim", "{e}");
        let client = "[[clients]]\nid = \"group:x\"\nkey_sha256 = \"00\"\n";
        let e = parse_jwt(&jwt_toml(ISSUER, client)).unwrap_err();
        assert_eq!(e.path, "clients[1].id", "{e}");
    }

    #[test]
    fn sign_in_needs_a_client_among_the_audiences_and_sane_lifetimes() {
        let cfg = parse_jwt(&jwt_toml(PROVIDER, "")).unwrap();
        assert!(cfg.jwt[0].sign_in().is_none(), "no client_id: no sign-in");
        let with = |extra: &str| {
            parse_jwt(&jwt_toml(
                &PROVIDER.replace(
                    "audiences = [\"turnstile\"]",
                    &format!("audiences = [\"turnstile\"]\n{extra}"),
                ),
                "",
            ))
        };
        let cfg = with("client_id = \"turnstile\"\nclient_secret_env = \"IDP_SECRET\"").unwrap();
        let (_, s) = cfg.jwt[0].sign_in().unwrap();
        assert_eq!(s.client_id, "turnstile");
        assert_eq!(s.scopes, ["openid", "offline_access"]);
        assert_eq!(
            (s.token_ttl.as_secs(), s.session_ttl.as_secs()),
            (900, 604_800)
        );
        for (bad, key) in [
            ("client_id = \"other\"", "client_id"),
            ("client_secret_env = \"X\"", "client_secret_env"),
            ("client_id = \"turnstile\"\nscopes = [\"email\"]", "scopes"),
            (
                "client_id = \"turnstile\"\ntoken_ttl_seconds = 0",
                "token_ttl_seconds",
            ),
            (
                "client_id = \"turnstile\"\ntoken_ttl_seconds = 600\nsession_ttl_seconds = 60",
                "session_ttl_seconds",
            ),
        ] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.path, format!("auth.oidc[0].{key}"), "{bad}: {e}");
        }
        // Its secret is the gateway's alone.
        let child = "[backends.x]\nkind = \"claude-code\"\ncommand = [\"claude\"]\nenv_passthrough = [\"IDP_SECRET\"]\n";
        let text = jwt_toml(
            &PROVIDER.replace("audiences = [\"turnstile\"]", "audiences = [\"turnstile\"]\nclient_id = \"turnstile\"\nclient_secret_env = \"IDP_SECRET\""),
            child,
        );
        let e = parse_jwt(&text).unwrap_err();
        assert_eq!(e.path, "backends.x.env_passthrough", "{e}");
    }
}
