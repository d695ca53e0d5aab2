//! The developer's side of sign-in: `turnstile login --gateway URL` runs the device flow
//! through the gateway and keeps the gateway's refresh token in a file only the user can read;
//! `turnstile token` prints a valid access token, refreshing it when it is past half its
//! life or the gateway no longer takes it (what Claude Code's `apiKeyHelper` and Codex's
//! provider `auth.command` run; both run it again after a 401). `turnstile logout` revokes
//! the sign-in and forgets it.
//!
//! The file (`--credentials`, `TURNSTILE_CREDENTIALS`, else
//! `$XDG_CONFIG_HOME/turnstile/credentials.json` or `~/.config/turnstile/credentials.json`)
//! holds one entry per gateway URL; it is written whole to a temporary file of mode 0600 and
//! renamed over the old one, so concurrent runs never see half a file.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// One gateway's sign-in, as the file keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Entry {
    pub refresh_token: String,
    #[serde(default)]
    pub access_token: String,
    /// Unix seconds.
    #[serde(default)]
    pub issued_at: u64,
    #[serde(default)]
    pub expires_at: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Credentials {
    #[serde(default)]
    pub gateways: BTreeMap<String, Entry>,
}

/// Where the credentials live unless `--credentials` says.
pub fn default_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TURNSTILE_CREDENTIALS") {
        return Some(p.into());
    }
    let base = match std::env::var_os("XDG_CONFIG_HOME") {
        Some(x) if !x.is_empty() => PathBuf::from(x),
        _ => PathBuf::from(std::env::var_os("HOME")?).join(".config"),
    };
    Some(base.join("turnstile").join("credentials.json"))
}

pub fn read(path: &Path) -> Result<Credentials, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a credentials file: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Credentials::default()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes the whole file: a temporary file of mode 0600 beside it, renamed over it.
pub fn write(path: &Path, c: &Credentials) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
    }
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    let text = serde_json::to_vec_pretty(c).map_err(|e| e.to_string())?;
    let written = f.write_all(&text).and_then(|_| f.sync_all());
    drop(f);
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn http() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())
}

/// POSTs JSON to the gateway: its status and JSON answer.
async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Result<(u16, Value), String> {
    let resp = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status().as_u16();
    let v = resp.json().await.unwrap_or(Value::Null);
    Ok((status, v))
}

fn base(gateway: &str) -> String {
    gateway.trim_end_matches('/').to_string()
}

fn oauth_error(v: &Value) -> String {
    let e = v["error"].as_str().unwrap_or("error");
    match v["error_description"].as_str() {
        Some(d) => format!("{e}: {d}"),
        None => e.to_string(),
    }
}

/// `turnstile login`: the device flow through `gateway`, the user told where to approve it
/// on stderr; the sign-in kept in `path`.
pub async fn login(gateway: &str, issuer: Option<&str>, path: &Path) -> Result<(), String> {
    let (client, gw) = (http()?, base(gateway));
    let mut start = json!({});
    if let Some(i) = issuer {
        start["issuer"] = json!(i);
    }
    let (status, v) = post(&client, &format!("{gw}/v1/auth/device"), &start).await?;
    if status != 200 {
        return Err(format!(
            "the gateway refused to start a sign-in: {}",
            oauth_error(&v)
        ));
    }
    let text = |k: &str| v[k].as_str().map(str::to_string);
    let (Some(device_code), Some(user_code), Some(uri)) = (
        text("device_code"),
        text("user_code"),
        text("verification_uri"),
    ) else {
        return Err("the gateway's answer lacks the device code".into());
    };
    let complete = text("verification_uri_complete");
    eprintln!(
        "To sign in, open {} and confirm the code {user_code}",
        complete.as_deref().unwrap_or(&uri)
    );
    let mut interval = v["interval"].as_u64().unwrap_or(5).clamp(1, 60);
    let deadline = now() + v["expires_in"].as_u64().unwrap_or(600).min(3600);
    let mut poll = json!({
        "grant_type": "urn:ietf:params:oauth:grant-type:device_code",
        "device_code": device_code,
    });
    if let Some(i) = text("issuer") {
        poll["issuer"] = json!(i);
    }
    loop {
        tokio::time::sleep(Duration::from_secs(interval)).await;
        if now() > deadline {
            return Err(
                "the code expired before it was confirmed; run `turnstile login` again".into(),
            );
        }
        let (status, t) = post(&client, &format!("{gw}/v1/auth/token"), &poll).await?;
        match (status, t["error"].as_str()) {
            (200, _) => {
                let entry = entry_of(&t, None)?;
                let mut c = read(path)?;
                c.gateways.insert(gw.clone(), entry);
                write(path, &c)?;
                eprintln!("Signed in to {gw}.");
                return Ok(());
            }
            (_, Some("authorization_pending")) => {}
            (_, Some("slow_down")) => interval += 5,
            _ => return Err(format!("sign-in failed: {}", oauth_error(&t))),
        }
    }
}

/// The entry a token answer makes (`refresh`: the refresh token kept from before).
fn entry_of(t: &Value, refresh: Option<&str>) -> Result<Entry, String> {
    let access = t["access_token"]
        .as_str()
        .ok_or("the gateway gave no access token")?;
    let refresh = t["refresh_token"]
        .as_str()
        .or(refresh)
        .ok_or("the gateway gave no refresh token")?;
    let issued_at = now();
    Ok(Entry {
        refresh_token: refresh.to_string(),
        access_token: access.to_string(),
        issued_at,
        expires_at: issued_at + t["expires_in"].as_u64().unwrap_or(0),
    })
}

/// The gateway entry to use: `gateway`'s, or the only one in the file.
fn pick(c: &Credentials, gateway: Option<&str>) -> Result<(String, Entry), String> {
    match gateway.map(base) {
        Some(g) => c
            .gateways
            .get(&g)
            .cloned()
            .map(|e| (g.clone(), e))
            .ok_or_else(|| format!("not signed in to {g}; run `turnstile login --gateway {g}`")),
        None => match c.gateways.len() {
            1 => Ok(c
                .gateways
                .iter()
                .next()
                .map(|(g, e)| (g.clone(), e.clone()))
                .expect("one")),
            0 => Err("not signed in; run `turnstile login --gateway URL`".into()),
            _ => Err("signed in to several gateways; name one with --gateway".into()),
        },
    }
}

/// `turnstile token`: a valid access token of `gateway` (the only one, when None). The kept
/// one while it has more than half its life left and the gateway still takes it; else a
/// refreshed one, kept for the next run.
pub async fn token(gateway: Option<&str>, path: &Path) -> Result<String, String> {
    let c = read(path)?;
    let (gw, e) = pick(&c, gateway)?;
    let client = http()?;
    let half = e.issued_at + (e.expires_at.saturating_sub(e.issued_at)) / 2;
    if !e.access_token.is_empty()
        && now() < half
        && still_taken(&client, &gw, &e.access_token).await
    {
        return Ok(e.access_token);
    }
    let body = json!({"grant_type": "refresh_token", "refresh_token": e.refresh_token});
    let (status, t) = post(&client, &format!("{gw}/v1/auth/token"), &body).await?;
    if status != 200 {
        return Err(format!(
            "could not refresh the sign-in to {gw} ({}); run `turnstile login --gateway {gw}`",
            oauth_error(&t)
        ));
    }
    let entry = entry_of(&t, Some(&e.refresh_token))?;
    // Read again: another run may have written meanwhile; the newest token wins either way.
    let mut c = read(path)?;
    c.gateways.insert(gw, entry.clone());
    write(path, &c)?;
    Ok(entry.access_token)
}

/// Whether the gateway still accepts `token` (a revoked session, or one whose groups changed,
/// is not: the harness asking again after a 401 gets a new token).
async fn still_taken(client: &reqwest::Client, gw: &str, token: &str) -> bool {
    let r = client
        .get(format!("{gw}/v1/whoami"))
        .bearer_auth(token)
        .send()
        .await;
    r.is_ok_and(|r| r.status().is_success())
}

/// `turnstile logout`: revokes the sign-in at the gateway and forgets it.
pub async fn logout(gateway: Option<&str>, path: &Path) -> Result<(), String> {
    let mut c = read(path)?;
    let (gw, e) = pick(&c, gateway)?;
    let body = json!({"token": e.refresh_token});
    let (status, t) = post(&http()?, &format!("{gw}/v1/auth/revoke"), &body).await?;
    if status != 200 {
        return Err(format!(
            "the gateway refused the sign-out: {}",
            oauth_error(&t)
        ));
    }
    c.gateways.remove(&gw);
    write(path, &c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_is_the_users_alone_and_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("credentials.json");
        assert!(read(&path).unwrap().gateways.is_empty(), "no file yet");
        let mut c = Credentials::default();
        c.gateways.insert(
            "https://gw.test".into(),
            Entry {
                refresh_token: "tsr-1".into(),
                ..Entry::default()
            },
        );
        write(&path, &c).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dir_mode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700);
        assert_eq!(
            read(&path).unwrap().gateways["https://gw.test"].refresh_token,
            "tsr-1"
        );
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temporary left"
        );
        // One gateway: it is picked without naming it; a trailing slash names the same one.
        assert_eq!(pick(&c, None).unwrap().0, "https://gw.test");
        assert!(pick(&c, Some("https://gw.test/")).is_ok());
        assert!(pick(&c, Some("https://other.test")).is_err());
    }
}
