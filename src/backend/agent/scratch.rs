//! A session's scratch folder: made private to the gateway's user ([`scratch_dir`]), removed
//! once its process is reaped ([`when_reaped`]), and swept at start when a gateway that is
//! gone left some behind ([`sweep_scratch`]).

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use super::child::Child;
use crate::backend::BackendError;

/// A fresh folder of session `id`'s own under the system's temporary folder
/// (`turnstile-<kind>-<pid>-<id>-<random>`), private to the gateway's user, with `folders`
/// made in it.
pub fn scratch_dir(kind: &str, id: u64, folders: &[&str]) -> Result<PathBuf, BackendError> {
    let dir = std::env::temp_dir().join(format!(
        "turnstile-{kind}-{}-{id}-{}",
        std::process::id(),
        crate::ids::new_id("")
    ));
    // Only the gateway's user may read what a session keeps there (its transcript, memory).
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .and_then(|()| {
            folders
                .iter()
                .try_for_each(|f| std::fs::create_dir(dir.join(f)))
        });
    made.map_err(|e| {
        let _ = std::fs::remove_dir_all(&dir);
        BackendError::Unavailable(format!("cannot create a session folder: {e}"))
    })?;
    Ok(dir)
}

/// Removes the scratch folders that gateways no longer running left in the system's
/// temporary folder (a crash or a kill skips their own cleanup): the folders named by
/// [`scratch_dir`] whose process id is not alive. A live process's are kept, whoever it is;
/// without `/proc` nothing can be told and nothing is removed. Returns how many went.
pub fn sweep_scratch() -> usize {
    sweep_scratch_in(&std::env::temp_dir(), std::path::Path::new("/proc"))
}

fn sweep_scratch_in(tmp: &std::path::Path, proc: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return 0;
    };
    if !proc.join("self").exists() {
        return 0;
    }
    let mut swept = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(scratch_owner) else {
            continue;
        };
        // A folder, not a link to one (the type of the entry itself).
        let folder = entry.file_type().is_ok_and(|t| t.is_dir());
        if !folder || pid == std::process::id() || proc.join(pid.to_string()).exists() {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => swept += 1,
            Err(e) => tracing::debug!(error = %e, "a stale scratch folder was not removed"),
        }
    }
    if swept > 0 {
        tracing::info!(
            folders = swept,
            "removed the scratch folders of gateways that are gone"
        );
    }
    swept
}

/// The gateway process id in a scratch folder's name
/// (`turnstile-<kind>-<pid>-<id>-<32 hex>`).
fn scratch_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("turnstile-")?;
    let mut parts = rest.rsplitn(4, '-');
    let (hex, id, pid, kind) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hexed = hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    (hexed && digits(id) && !kind.is_empty()).then(|| pid.parse().ok())?
}

/// Once `child` is reaped and nothing of its group runs (so nothing writes there any more):
/// `gone` runs (the session gives its place back) and the scratch folder is removed.
pub fn when_reaped(child: &Child, scratch: Option<PathBuf>, gone: impl FnOnce() + Send + 'static) {
    let reaped = child.reaped().clone();
    child.spawn_task(async move {
        reaped.cancelled().await;
        gone();
        if let Some(dir) = scratch {
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(error = %e, "a session's scratch folder was not removed");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_folders_of_dead_gateways_are_swept_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir(proc.path().join("self")).unwrap();
        std::fs::create_dir(proc.path().join("4242")).unwrap();
        let hex = "0123456789abcdef0123456789abcdef";
        let mine = format!("turnstile-acp-{}-1-{hex}", std::process::id());
        for name in [
            format!("turnstile-acp-999999-1-{hex}"),
            format!("turnstile-claude-999998-3-{hex}"),
            format!("turnstile-acp-4242-2-{hex}"),
            mine.clone(),
            "turnstile-acp-999999-1-short".into(),
            "other-999999".into(),
        ] {
            std::fs::create_dir(tmp.path().join(&name)).unwrap();
            std::fs::write(tmp.path().join(&name).join("f"), "x").unwrap();
        }
        // A link named like a dead gateway's folder is not followed or removed.
        let target = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            target.path(),
            tmp.path().join(format!("turnstile-acp-999997-1-{hex}")),
        )
        .unwrap();
        assert_eq!(sweep_scratch_in(tmp.path(), proc.path()), 2);
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want = vec![
            "other-999999".to_string(),
            format!("turnstile-acp-4242-2-{hex}"),
            format!("turnstile-acp-999997-1-{hex}"),
            "turnstile-acp-999999-1-short".into(),
            mine,
        ];
        want.sort();
        assert_eq!(left, want);
        assert!(target.path().exists());
        assert_eq!(
            scratch_owner(&format!("turnstile-claude-code-7-1-{hex}")),
            Some(7)
        );
    }
}
