//! One agent child process, whatever protocol it speaks: spawned with an environment built
//! from an allowlist (never the gateway's own secrets: the agent may run commands that read
//! its environment) as the leader of its own process group; its stdin (`stdin.rs`: written
//! by the sending task at once, a writer task for what the pipe did not take); a reader task that splits its stdout into bounded lines for the kind's
//! [`Output`]; its stderr forwarded verbatim only until the kind's handshake is done; and a
//! supervisor that reaps it, then kills whatever of its process group is left.
//!
//! How it ends: its stdout ends or it exits ([`Output::ended`], then the backend's death
//! counter moves); [`Child::close`] (a drained child that holds nothing) kills it at once;
//! the gateway's shutdown closes stdin and gives it `EXIT_GRACE` to exit before killing it.

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{ChildStderr, ChildStdout, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lines::{Lines, MAX_LINE_BYTES};
use super::stdin::Stdin;
use crate::backend::BackendError;
use crate::config::ChildConfig;

/// The longest stderr line forwarded (a longer one is dropped).
const STDERR_LINE_BYTES: usize = 64 * 1024;

/// How long a child gets to exit after stdin closes (shutdown) before it is killed, and how
/// long its output is still read once it exited.
pub const EXIT_GRACE: Duration = Duration::from_secs(5);

/// What a child's output reaches: the kind's protocol.
pub trait Output: Send + Sync + 'static {
    /// One stdout line, without its newline, in order.
    fn line(self: &Arc<Self>, line: &[u8]);
    /// The child is gone for `why`: its output ended, or it exited (after the lines it wrote
    /// were handed on, or `EXIT_GRACE`). May be called more than once.
    fn ended(&self, why: &str);
}

pub struct Child {
    pub id: u64,
    stdin: Arc<Stdin>,
    dead: CancellationToken,
    /// Cancelled when the reader has seen the end of stdout (every line handed on).
    reader_done: CancellationToken,
    /// Cancelled once the child is reaped and its process group killed.
    reaped: CancellationToken,
    /// Cancelled to kill the child now.
    close: CancellationToken,
    /// The gateway's shutdown.
    stop: CancellationToken,
    /// The handshake is done: stderr lines are withheld from then on.
    started: Arc<AtomicBool>,
    tracker: TaskTracker,
    /// The process id, which leads the child's process group.
    pid: Option<u32>,
}

impl Drop for Child {
    /// The last handle is gone: stdin closes, which asks the child to exit.
    fn drop(&mut self) {
        self.stdin.shut();
    }
}

/// The parts of a spawned child that [`Child::attach`] hands to its tasks.
pub struct Io {
    process: tokio::process::Child,
    stdout: ChildStdout,
    stderr: ChildStderr,
}

impl Child {
    /// Spawns the child and its stdin writer. Nothing reads its output until
    /// [`Child::attach`].
    pub fn spawn(
        id: u64,
        cfg: &ChildConfig,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<(Arc<Child>, Io), BackendError> {
        let mut process = command(cfg).spawn().map_err(|e| {
            BackendError::Unavailable(format!("cannot start {}: {e}", cfg.command[0]))
        })?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.stdin.take(),
            process.stdout.take(),
            process.stderr.take(),
        ) else {
            return Err(BackendError::Unavailable("child stdio not piped".into()));
        };
        tracing::info!(
            backend_process = id,
            pid = process.id(),
            "backend process started"
        );
        let (dead, close) = (CancellationToken::new(), CancellationToken::new());
        // The writer ends (closing stdin asks the child to exit) on death, shutdown or close.
        let ends = [dead.clone(), shutdown.clone(), close.clone()];
        let child = Arc::new(Child {
            id,
            stdin: Stdin::start(stdin, tracker, ends),
            dead,
            reader_done: CancellationToken::new(),
            reaped: CancellationToken::new(),
            close,
            stop: shutdown.clone(),
            started: Arc::new(AtomicBool::new(false)),
            tracker: tracker.clone(),
            pid: process.id(),
        });
        Ok((
            child,
            Io {
                process,
                stdout,
                stderr,
            },
        ))
    }

    /// Starts reading the child's output into `output`, forwarding its stderr, and
    /// supervising it; `deaths` counts its exit.
    pub fn attach<O: Output>(&self, io: Io, output: Arc<O>, deaths: Arc<watch::Sender<u64>>) {
        let Io {
            mut process,
            stdout,
            stderr,
        } = io;
        let (id, pid) = (self.id, process.id());
        forward_stderr(&self.tracker, id, stderr, self.started.clone());

        let (reader_output, reader_done) = (output.clone(), self.reader_done.clone());
        self.tracker.spawn(async move {
            // Lines longer than a read are put together in `lines`, so a read need not hold
            // a whole line.
            let mut stdout = stdout;
            let mut lines = Lines::new(MAX_LINE_BYTES);
            loop {
                let dropped = lines.dropped;
                match lines
                    .read_from(&mut stdout, |line| reader_output.line(line))
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if lines.dropped > dropped {
                    tracing::warn!(
                        backend_process = id,
                        max_bytes = MAX_LINE_BYTES,
                        "dropped a backend line over the line bound"
                    );
                }
            }
            reader_output.ended("backend closed its output");
            reader_done.cancel();
        });

        // Supervisor: reaps the child, killing it if it outlives the shutdown grace period,
        // then whatever it left running in its process group.
        let (stop, close) = (self.stop.clone(), self.close.clone());
        let (dead, reader_done) = (self.dead.clone(), self.reader_done.clone());
        let reaped = self.reaped.clone();
        // The group is signalled while its leader is not yet reaped where possible, so its id
        // cannot have been reused; after a leader exited on its own, what it left is killed
        // right after the reap.
        let kill = move |process: &mut tokio::process::Child| {
            if let Some(pid) = pid {
                kill_group(pid);
            }
            let _ = process.start_kill();
        };
        self.tracker.spawn(async move {
            let status = tokio::select! {
                status = process.wait() => status.ok(),
                // A child that holds nothing is killed at once (Codex takes 1 to 4 s to exit
                // on stdin EOF, and meanwhile a fresh process warms up beside it).
                _ = close.cancelled() => {
                    kill(&mut process);
                    process.wait().await.ok()
                }
                _ = stop.cancelled() => {
                    match tokio::time::timeout(EXIT_GRACE, process.wait()).await {
                        Ok(status) => status.ok(),
                        Err(_) => {
                            kill(&mut process);
                            process.wait().await.ok()
                        }
                    }
                }
            };
            if let Some(pid) = pid {
                kill_group(pid);
            }
            reaped.cancel();
            tracing::info!(backend_process = id, pid, status = ?status, "backend process exited");
            // Dead for new work at once, but the lines it wrote before exiting are handed on
            // before its turns learn they are lost: the reader ends them at end of output. A
            // grandchild holding stdout open must not delay that forever.
            dead.cancel();
            let _ = tokio::time::timeout(EXIT_GRACE, reader_done.cancelled()).await;
            output.ended("backend process exited");
            deaths.send_modify(|n| *n += 1);
        });
    }

    /// Writes one line (ending in `\n`) to stdin, in order with the others: at once from
    /// the caller's task when nothing is queued before it (`stdin.rs`).
    pub fn send(&self, line: String) {
        self.stdin.send(line.as_bytes());
    }

    pub fn is_alive(&self) -> bool {
        !self.dead.is_cancelled()
    }

    /// Cancelled once the child is dead (exited, or its kind gave up on it).
    pub fn dead(&self) -> &CancellationToken {
        &self.dead
    }

    /// The kind gives up on the child (its output ended): no new work reaches it.
    pub fn mark_dead(&self) {
        self.dead.cancel();
    }

    /// Cancelled once the child is reaped and what it left in its group is killed.
    pub fn reaped(&self) -> &CancellationToken {
        &self.reaped
    }

    /// The gateway is shutting down.
    pub fn stopping(&self) -> &CancellationToken {
        &self.stop
    }

    /// Kills the child now (it holds nothing any more).
    pub fn close(&self) {
        self.close.cancel();
    }

    /// Asks the child's whole group to exit (SIGTERM), and kills it if it has not after
    /// `grace`: an agent that cleans up on exit (its locks, its session files) gets to.
    pub fn terminate(self: &Arc<Self>, grace: Duration) {
        if let (Some(pid), false) = (self.pid, self.reaped.is_cancelled()) {
            // The leader is not reaped (the supervisor holds it), so the group id is its own.
            let group = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(group) = group {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::TERM);
            }
        }
        let me = self.clone();
        self.tracker.spawn(async move {
            if tokio::time::timeout(grace, me.reaped.cancelled())
                .await
                .is_err()
            {
                me.close();
            }
        });
    }

    pub fn is_closed(&self) -> bool {
        self.close.is_cancelled()
    }

    /// The kind's handshake is done: from now on a stderr line may quote a prompt or a tool's
    /// output, and only its size is logged.
    pub fn handshake_done(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Runs a task of this child's (it is waited for at shutdown).
    pub fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }
}

/// `command --version`, run with the child's environment and nothing to read: the version
/// the program reports.
pub async fn version(cfg: &ChildConfig) -> Result<String, BackendError> {
    let mut cmd = command(cfg);
    cmd.arg("--version").stdin(Stdio::null());
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .map_err(|_| BackendError::Unavailable("`--version` did not answer in 30 s".into()))?
        .map_err(|e| BackendError::Unavailable(format!("cannot start {}: {e}", cfg.command[0])))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || text.is_empty() {
        return Err(BackendError::Unavailable(format!(
            "`{} --version` failed ({})",
            cfg.command[0], out.status
        )));
    }
    Ok(text)
}

/// The child's command: the config's argv, cwd and `env`, plus only the variables of the
/// gateway's environment that `env_passthrough` names (the config's resolved pass list). It
/// leads a process group of its own, so that what it starts can be killed with it.
pub fn command(cfg: &ChildConfig) -> Command {
    let passed = cfg
        .env_passthrough
        .iter()
        .filter_map(|k| Some((k, std::env::var_os(k)?)));
    let mut cmd = Command::new(&cfg.command[0]);
    cmd.args(&cfg.command[1..])
        .env_clear()
        .envs(passed)
        .envs(&cfg.env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = &cfg.cwd {
        cmd.current_dir(cwd);
    }
    cmd
}

/// Kills what is left of the process group `pid` led (the child itself is reaped by then).
fn kill_group(pid: u32) {
    let group = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    if let Some(group) = group {
        // ESRCH (the group is already empty) is the usual answer.
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    }
}

/// Forwards the child's stderr (its own log) at debug. Until `started` is set (the handshake
/// is done) a line can only be about starting (a bad flag, a config the backend refuses) and
/// is logged as it is; after it a line may quote a prompt or a tool's output, so only its
/// size is logged.
fn forward_stderr(tracker: &TaskTracker, id: u64, stderr: ChildStderr, started: Arc<AtomicBool>) {
    tracker.spawn(async move {
        // A backend's own log: rarely written, its lines put together by `lines`.
        let (mut stderr, mut lines) = (stderr, Lines::new(STDERR_LINE_BYTES));
        let forward = |line: &[u8]| {
            if started.load(Ordering::Relaxed) {
                tracing::debug!(
                    backend_process = id,
                    bytes = line.len(),
                    "backend stderr line (content withheld)"
                );
            } else {
                let line = String::from_utf8_lossy(line);
                tracing::debug!(backend_process = id, "backend stderr: {line}");
            }
        };
        while let Ok(1..) = lines.read_from(&mut stderr, forward).await {}
    });
}

#[cfg(test)]
mod tests {
    use parking_lot::Mutex;

    use super::*;

    struct Seen(Mutex<Vec<String>>);

    impl Output for Seen {
        fn line(self: &Arc<Self>, line: &[u8]) {
            self.0.lock().push(String::from_utf8_lossy(line).into());
        }
        fn ended(&self, _why: &str) {}
    }

    /// Alive: `/proc/<pid>` exists and is not a zombie.
    fn running(pid: &str) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|s| !s.trim_start().starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn a_closed_child_takes_what_it_started_with_it() {
        let (child, mut died, seen) = sh("sleep 300 & echo $!; exec sleep 300");
        let grandchild = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if let Some(pid) = seen.0.lock().first().cloned() {
                    return pid;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the child prints its background job's pid");
        assert!(running(&grandchild));
        child.close();
        tokio::time::timeout(Duration::from_secs(10), died.changed())
            .await
            .unwrap()
            .unwrap();
        assert!(!child.is_alive());
        // SIGKILL was sent to the group before the death was counted; it lands at once.
        let gone = tokio::time::timeout(Duration::from_secs(5), async {
            while running(&grandchild) {
                tokio::task::yield_now().await;
            }
        });
        assert!(
            gone.await.is_ok(),
            "pid {grandchild} outlived its group's leader"
        );
    }

    /// A child of `script` (under `sh -c`), attached; and its death counter.
    fn sh(script: &str) -> (Arc<Child>, watch::Receiver<u64>, Arc<Seen>) {
        let cfg = ChildConfig {
            command: vec!["sh".into(), "-c".into(), script.into()],
            env: Default::default(),
            env_passthrough: vec!["PATH".into()],
            cwd: None,
        };
        let (tracker, shutdown) = (TaskTracker::new(), CancellationToken::new());
        let (child, io) = Child::spawn(1, &cfg, &tracker, &shutdown).unwrap();
        let seen = Arc::new(Seen(Mutex::new(Vec::new())));
        let deaths = Arc::new(watch::Sender::new(0));
        let died = deaths.subscribe();
        child.attach(io, seen.clone(), deaths);
        (child, died, seen)
    }

    async fn ready(seen: &Seen) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while seen.0.lock().is_empty() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the child says it is ready");
    }

    #[tokio::test]
    async fn a_terminated_child_exits_on_its_own_and_one_that_will_not_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("cleaned-up");
        // Cleans up on SIGTERM.
        let script = format!(
            "trap 'echo done > {}; exit 0' TERM; echo ready; sleep 300 & wait",
            mark.display()
        );
        let (child, mut died, seen) = sh(&script);
        ready(&seen).await;
        child.terminate(Duration::from_secs(60));
        tokio::time::timeout(Duration::from_secs(10), died.changed())
            .await
            .expect("it exits well before the grace ends")
            .unwrap();
        assert_eq!(std::fs::read_to_string(&mark).unwrap().trim(), "done");
        // Ignores SIGTERM: killed once the grace is over.
        let (child, mut died, seen) = sh("trap '' TERM; echo ready; while :; do sleep 1; done");
        ready(&seen).await;
        child.terminate(Duration::from_millis(200));
        tokio::time::timeout(Duration::from_secs(10), died.changed())
            .await
            .expect("killed after the grace")
            .unwrap();
        assert!(!child.is_alive());
    }
}
