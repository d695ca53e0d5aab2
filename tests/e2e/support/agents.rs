//! The agent processes a gateway started and the scratch folders of their sessions: what a
//! test of an agent kind checks is gone when a session ends.

use std::time::Duration;

use super::{children, wait_for_within, Gateway};

/// The agents the gateway started (its children but the demo backend of the default config).
pub fn agents(gw: &Gateway) -> Vec<u32> {
    let demo = |pid: &u32| {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmd).contains("turnstile-demo-backend")
    };
    children(gw.pid())
        .into_iter()
        .filter(|p| !demo(p))
        .collect()
}

/// The agents and their processes (zombies included until reaped).
pub fn agent_processes(gw: &Gateway) -> Vec<u32> {
    let mut out = Vec::new();
    let mut queue = agents(gw);
    while let Some(pid) = queue.pop() {
        out.push(pid);
        queue.extend(children(pid));
    }
    out
}

/// The sessions' scratch folders left.
pub fn scratch_folders(gw: &Gateway, scratch: &str) -> Vec<String> {
    let prefix = format!("turnstile-{scratch}-{}-", gw.pid());
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// Waits (bounded) until no agent process and no session folder is left.
pub async fn no_agent_left(gw: &Gateway, scratch: &str) {
    wait_for_within(
        "every agent process and session folder gone",
        Duration::from_secs(30),
        || {
            let procs: Vec<String> = agent_processes(gw)
                .iter()
                .map(|p| {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    format!(
                        "{stat} {}",
                        String::from_utf8_lossy(&cmd).replace('\0', " ")
                    )
                })
                .collect();
            format!("{procs:?} {:?}\n{}", scratch_folders(gw, scratch), gw.log())
        },
        async || {
            let gone = agent_processes(gw).is_empty() && scratch_folders(gw, scratch).is_empty();
            gone.then_some(())
        },
    )
    .await;
}
