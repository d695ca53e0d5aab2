//! A real PostgreSQL 15 server for the tests, started by the tests themselves: `initdb` into a
//! temporary folder and `postgres` on a free loopback port, as the unprivileged `nobody` when
//! the tests run as root, with password authentication (SCRAM) for every connection. One
//! server per test process; each gateway (or group of replicas) gets its own database.
//!
//! The server runs under a small shell that waits on its stdin: when the test process exits
//! (however it exits), the pipe closes and the shell stops the server and removes its folder,
//! so no server and no data outlive the tests (the process-wide server is never dropped). Durability settings are relaxed (`fsync=off`): the tests kill gateways, never the
//! database's machine.
//!
//! `TURNSTILE_TEST_STORE=postgres` runs every other e2e test on it too (each gateway's
//! `[store]` becomes a database here), except the ones that inspect the SQLite file.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The PostgreSQL 15 server binaries on this machine image.
const BIN: &str = "/usr/lib/postgresql/15/bin";
/// The superuser the tests create, and its password (given to gateways by environment).
pub const USER: &str = "turnstile";
pub const PASSWORD: &str = "pg-test-password-5521";
/// The environment variable gateways read the password from.
pub const PASSWORD_ENV: &str = "TURNSTILE_PG_PASSWORD";

pub struct Server {
    pub port: u16,
    /// Closing it stops the server; a `restart` line restarts it.
    stdin: Mutex<Option<ChildStdin>>,
    /// Each time the server is ready.
    ready: Mutex<std::sync::mpsc::Receiver<Result<(), String>>>,
    child: Mutex<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    /// Stops the server (fast shutdown) and waits for it.
    fn drop(&mut self) {
        drop(self.stdin.lock().unwrap().take());
        let _ = self.child.lock().unwrap().wait();
    }
}

/// Whether the whole suite runs on PostgreSQL.
pub fn suite_on_postgres() -> bool {
    std::env::var("TURNSTILE_TEST_STORE").is_ok_and(|v| v == "postgres")
}

fn run_as(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={u}"),
                &format!("--regid={}", if u == "nobody" { "nogroup" } else { u }),
                "--clear-groups",
                "--",
            ])
            .arg(program);
            c
        }
        None => Command::new(program),
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        .unwrap_or(false)
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Server {
    /// A server of the caller's own (stopped when dropped), for a test that takes the
    /// database away.
    pub fn start() -> Server {
        start()
    }

    /// A new, empty database on this server; its URL.
    pub fn database(&self) -> String {
        create_database(self.port)
    }

    /// Stops the server (fast shutdown: every connection is closed) and starts it again on
    /// the same port and data; returns once it accepts connections.
    pub fn restart(&self) {
        let mut stdin = self.stdin.lock().unwrap();
        let stdin = stdin.as_mut().expect("running");
        stdin.write_all(b"restart\n").expect("restart");
        stdin.flush().expect("restart");
        let ready = self.ready.lock().unwrap();
        let again = ready.recv_timeout(Duration::from_secs(60));
        assert!(
            matches!(again, Ok(Ok(()))),
            "postgres did not restart: {again:?}"
        );
    }
}

fn start() -> Server {
    assert!(
        Path::new(BIN).join("postgres").exists(),
        "PostgreSQL 15's server binaries are missing from {BIN}"
    );
    let user = is_root().then_some("nobody");
    let dir = tempfile::Builder::new()
        .prefix("turnstile-pg")
        .tempdir()
        .expect("tempdir");
    let data = dir.path().join("data");
    let pwfile = dir.path().join("pw");
    std::fs::write(&pwfile, PASSWORD).expect("pwfile");
    if user.is_some() {
        for p in [dir.path(), pwfile.as_path()] {
            std::os::unix::fs::chown(p, Some(65534), Some(65534)).expect("chown to nobody");
        }
    }
    let out = run_as(user, &Path::new(BIN).join("initdb"))
        .args(["-D"])
        .arg(&data)
        .args([
            "-U",
            USER,
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .arg(format!("--pwfile={}", pwfile.display()))
        .output()
        .expect("initdb");
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for attempt in 0..3 {
        let port = free_port();
        let script = format!(
            "{bin}/postgres -D {data} -p {port} -k {sock} -c listen_addresses=127.0.0.1 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=300 -c shared_buffers=64MB & pid=$!; \
             while read cmd && [ \"$cmd\" = restart ]; do kill -INT $pid; wait $pid; \
             {bin}/postgres -D {data} -p {port} -k {sock} -c listen_addresses=127.0.0.1 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=300 -c shared_buffers=64MB & pid=$!; done; \
             kill -INT $pid; wait $pid; rm -rf {folder}",
            bin = BIN,
            data = data.display(),
            sock = dir.path().display(),
            folder = dir.path().display(),
        );
        let mut child = run_as(user, Path::new("/bin/sh"))
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start postgres");
        let stdin = child.stdin.take().expect("stdin");
        let stderr = child.stderr.take().expect("stderr");
        // Ready when the server says so (bounded): its log, not a polling loop; again after
        // each restart.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut ready = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("ready to accept connections") {
                    ready = true;
                    let _ = tx.send(Ok(()));
                }
                if !ready && (line.contains("could not bind") || line.contains("FATAL")) {
                    let _ = tx.send(Err(line));
                    return;
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(())) => {
                return Server {
                    port,
                    stdin: Mutex::new(Some(stdin)),
                    ready: Mutex::new(rx),
                    child: Mutex::new(child),
                    _dir: dir,
                }
            }
            Ok(Err(line)) if attempt < 2 => {
                eprintln!("postgres did not start on port {port}: {line}; another port");
                // The server has exited; the shell goes without removing the folder the
                // next attempt uses.
                let _ = child.kill();
                let _ = child.wait();
                drop(stdin);
            }
            other => {
                drop(stdin);
                let _ = child.wait();
                panic!("postgres did not start: {other:?}")
            }
        }
    }
    unreachable!()
}

/// The server of this test process, started on first use.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(start)
}

/// A new, empty database; returns its URL (no password: gateways read it from
/// [`PASSWORD_ENV`]).
pub fn database() -> String {
    create_database(server().port)
}

fn create_database(port: u16) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "t{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = Command::new(PathBuf::from(BIN).join("createdb"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                USER,
                &name,
            ])
            .env("PGPASSWORD", PASSWORD)
            .output()
            .expect("createdb");
        if out.status.success() {
            break;
        }
        // Two CREATE DATABASE at once may collide on the template; try again (bounded).
        assert!(
            Instant::now() < deadline,
            "createdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    format!("postgres://{USER}@127.0.0.1:{port}/{name}")
}

/// A `[store]` section on a new database.
pub fn store_section(url: &str) -> String {
    format!("\n[store]\nurl = \"{url}\"\npassword_env = \"{PASSWORD_ENV}\"\n")
}

/// Runs SQL on a database as the superuser (tests that look into the shared store).
pub fn psql(url: &str, sql: &str) -> String {
    let (host, db) = url.rsplit_once('/').expect("db name");
    let port = host.rsplit(':').next().expect("port");
    let out = Command::new(PathBuf::from(BIN).join("psql"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            port,
            "-U",
            USER,
            "-d",
            db,
            "-At",
            "-c",
            sql,
        ])
        .env("PGPASSWORD", PASSWORD)
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
