//! A child's stdin. A line is written by the task that sends it, at once, when nothing is
//! queued before it: a non-blocking write to the pipe, which takes a protocol line whole
//! unless the pipe is full. Only what the pipe did not take is queued for the writer task,
//! which writes everything queued in one go per wake-up. So the request that answers a held
//! call reaches the child without a hop to another task, and the order of lines is kept: a
//! line never passes one queued before it.
//!
//! Written by hand over `rustix::io::write`: tokio's `ChildStdin` offers only async writes,
//! which need a task of their own to own the pipe.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(super) struct Stdin {
    state: Mutex<State>,
    wake: Notify,
    /// Cancelled when its child's handle is dropped: stdin closes, as a channel's would.
    shut: CancellationToken,
}

struct State {
    /// A second descriptor of the pipe (non-blocking, as tokio set it), for direct writes;
    /// None once stdin is closed.
    direct: Option<OwnedFd>,
    /// Bytes the pipe did not take yet, in order.
    queue: VecDeque<u8>,
    /// The writer task holds bytes it took from the queue and has not written yet.
    busy: bool,
}

impl Stdin {
    /// Takes the child's stdin; the writer ends (closing stdin, which asks the child to exit)
    /// when any of `ends` is cancelled or a write fails.
    pub fn start(
        stdin: ChildStdin,
        tracker: &TaskTracker,
        ends: [CancellationToken; 3],
    ) -> Arc<Stdin> {
        let direct = stdin
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| tracing::debug!(error = %e, "no direct stdin writes for this child"))
            .ok();
        let this = Arc::new(Stdin {
            state: Mutex::new(State {
                direct,
                queue: VecDeque::new(),
                busy: false,
            }),
            wake: Notify::new(),
            shut: CancellationToken::new(),
        });
        let writer = this.clone();
        tracker.spawn(async move {
            let [a, b, c] = ends;
            tokio::select! {
                _ = writer.write_queued(stdin) => {}
                _ = a.cancelled() => {}
                _ = b.cancelled() => {}
                _ = c.cancelled() => {}
            }
            writer.close();
        });
        this
    }

    /// Writes `line` after everything sent before it.
    pub fn send(&self, line: &[u8]) {
        let mut st = self.state.lock();
        let Some(fd) = st.direct.as_ref() else {
            // Closed: the child is gone or going, and its reader reports it.
            return;
        };
        let mut rest = line;
        if st.queue.is_empty() && !st.busy {
            match rustix::io::write(fd, rest) {
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
            if rest.is_empty() {
                return;
            }
        }
        st.queue.extend(rest);
        drop(st);
        self.wake.notify_one();
    }

    /// The writer: everything queued, in one write per wake-up. Ends when a write fails, or
    /// once what was queued is written after [`Stdin::shut`].
    async fn write_queued(&self, mut stdin: ChildStdin) {
        loop {
            let last = tokio::select! {
                _ = self.wake.notified() => false,
                _ = self.shut.cancelled() => true,
            };
            loop {
                let batch: Vec<u8> = {
                    let mut st = self.state.lock();
                    if st.queue.is_empty() {
                        st.busy = false;
                        break;
                    }
                    st.busy = true;
                    st.queue.drain(..).collect()
                };
                if stdin.write_all(&batch).await.is_err() || stdin.flush().await.is_err() {
                    return;
                }
            }
            if last {
                return;
            }
        }
    }

    /// Closes stdin (once what is queued could not matter: the child's handle is gone).
    pub fn shut(&self) {
        self.shut.cancel();
    }

    /// Closes the direct descriptor; the writer's own is closed as its task ends.
    fn close(&self) {
        let mut st = self.state.lock();
        st.direct = None;
        st.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn lines_arrive_whole_and_in_order_past_a_full_pipe() {
        let mut cat = tokio::process::Command::new("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (stdin, mut stdout) = (cat.stdin.take().unwrap(), cat.stdout.take().unwrap());
        let tracker = TaskTracker::new();
        let ends = [(); 3].map(|()| CancellationToken::new());
        let s = Stdin::start(stdin, &tracker, ends);
        // Nobody reads yet: the pipe fills and the rest queues behind it.
        let mut sent = Vec::new();
        for i in 0..10_000 {
            let line = format!("{i:05} {}\n", "x".repeat(100));
            s.send(line.as_bytes());
            sent.extend_from_slice(line.as_bytes());
        }
        assert!(!s.state.lock().queue.is_empty(), "the pipe took everything");
        s.shut();
        let mut got = Vec::new();
        stdout.read_to_end(&mut got).await.unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "lines out of order");
    }
}
