//! `[[auth.jwt]]`: each trusted issuer is validated, its key files are read through the
//! caller's reader and checked by `auth::jwt`, and it becomes a frozen [`JwtIssuer`].

use std::path::Path;
use std::sync::Arc;

use jsonwebtoken::Algorithm;

use super::raw::RawJwt;
use super::validate::{globs, limits, roles};
use super::{err, resolve, ConfigError, JwtIssuer};
use crate::auth::jwt::{family_name, jwks_keys, parse_algorithm, pem_keys};

/// The most clock skew an issuer may be granted.
const MAX_LEEWAY_SECONDS: u64 = 300;

/// `[[auth.jwt]]`: validates each issuer and reads its key material through `read`.
pub(super) fn jwt_issuers(
    raw: Vec<RawJwt>,
    base: &Path,
    read: &dyn Fn(&Path) -> std::io::Result<Vec<u8>>,
) -> Result<Vec<Arc<JwtIssuer>>, ConfigError> {
    let mut out: Vec<Arc<JwtIssuer>> = Vec::new();
    for (i, j) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("auth.jwt[{i}].{k}");
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
                format!("auth.jwt[{i}].audiences[{k}]"),
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
            let alg = parse_algorithm(name)
                .map_err(|m| err(format!("auth.jwt[{i}].algorithms[{k}]"), m))?;
            if let Some(first) = algorithms.first() {
                if first.family() != alg.family() {
                    return Err(err(
                        format!("auth.jwt[{i}].algorithms[{k}]"),
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
            return Err(err(
                format!("auth.jwt[{i}].require[{k}]"),
                "must not be empty",
            ));
        }
        if j.typ.as_deref() == Some("") {
            return Err(err(
                at("typ"),
                "must not be empty (leave it out to accept any)",
            ));
        }
        let models = globs(&j.models, &format!("auth.jwt[{i}].models"))?;
        let roles = roles(&j.roles, &format!("auth.jwt[{i}].roles"))?;
        let limits = limits(
            &format!("auth.jwt[{i}]"),
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
            models,
            roles,
            limits,
        }));
    }
    Ok(out)
}
