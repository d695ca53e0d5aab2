//! The request log line, one per request, written by hand: the same fields, level and format
//! (text or JSON) as `tracing`'s fmt layer writes them, on the same writer, without its
//! per-field dynamic dispatch and `fmt` machinery (a tenth of a relayed request's
//! instructions). The level is still `TURNSTILE_LOG`'s to allow, for the target
//! `turnstile::http`. The binary installs the writer ([`install`]); without one (tests, an
//! embedder) the line goes through `tracing`.

use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::Level;
use tracing_appender::non_blocking::NonBlocking;
use tracing_subscriber::fmt::MakeWriter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

struct Sink {
    writer: NonBlocking,
    format: Format,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// The writer and format the log's fmt layer uses; the first call wins.
pub fn install(writer: NonBlocking, format: Format) {
    let _ = SINK.set(Sink { writer, format });
}

/// One request's line: ids and figures only, never bodies, headers or credentials.
pub(super) struct Line<'a> {
    pub request: &'a str,
    pub method: &'a str,
    pub route: &'a str,
    pub status: u16,
    pub code: &'a str,
    pub execution: &'a str,
    pub micros: u64,
}

/// Served requests at info, gateway failures (5xx) at error, rejections (4xx) at debug.
pub(super) fn log(line: &Line<'_>) {
    let level = match line.status {
        500.. => Level::ERROR,
        400.. => Level::DEBUG,
        _ => Level::INFO,
    };
    let enabled = match level {
        Level::ERROR => tracing::enabled!(target: "turnstile::http", Level::ERROR),
        Level::DEBUG => tracing::enabled!(target: "turnstile::http", Level::DEBUG),
        _ => tracing::enabled!(target: "turnstile::http", Level::INFO),
    };
    if !enabled {
        return;
    }
    let Some(sink) = SINK.get() else {
        return through_tracing(line, level);
    };
    let mut buf = Vec::with_capacity(320);
    match sink.format {
        Format::Text => text(&mut buf, line, level, SystemTime::now()),
        Format::Json => json(&mut buf, line, level, SystemTime::now()),
    }
    // As the fmt layer does: a line that cannot be queued is lost, never waited for.
    let _ = sink.writer.make_writer().write_all(&buf);
}

fn through_tracing(l: &Line<'_>, level: Level) {
    let (request, method, route, status, code, execution, micros) = (
        l.request,
        l.method,
        l.route,
        l.status,
        l.code,
        l.execution,
        l.micros,
    );
    match level {
        Level::ERROR => {
            tracing::error!(target: "turnstile::http", request = %request, method = %method, route = %route, status, code, execution = %execution, micros, "request")
        }
        Level::DEBUG => {
            tracing::debug!(target: "turnstile::http", request = %request, method = %method, route = %route, status, code, execution = %execution, micros, "request")
        }
        _ => {
            tracing::info!(target: "turnstile::http", request = %request, method = %method, route = %route, status, code, execution = %execution, micros, "request")
        }
    }
}

/// `2026-12-07T04:10:04.080528Z  INFO turnstile::http: request request=req-… method=POST
/// route=/v1/chat/completions status=200 code="" execution=exe-… micros=2210`
fn text(buf: &mut Vec<u8>, l: &Line<'_>, level: Level, now: SystemTime) {
    timestamp(buf, now);
    let level: &[u8] = match level {
        Level::ERROR => b" ERROR",
        Level::DEBUG => b" DEBUG",
        _ => b"  INFO",
    };
    buf.extend_from_slice(level);
    buf.extend_from_slice(b" turnstile::http: request request=");
    buf.extend_from_slice(l.request.as_bytes());
    buf.extend_from_slice(b" method=");
    buf.extend_from_slice(l.method.as_bytes());
    buf.extend_from_slice(b" route=");
    buf.extend_from_slice(l.route.as_bytes());
    buf.extend_from_slice(b" status=");
    number(buf, l.status.into());
    // `code` is a `&str` field: the fmt layer shows it with its Debug quotes.
    let _ = write!(buf, " code={:?} execution=", l.code);
    buf.extend_from_slice(l.execution.as_bytes());
    buf.extend_from_slice(b" micros=");
    number(buf, l.micros);
    buf.push(b'\n');
}

/// `{"timestamp":"…","level":"INFO","fields":{"message":"request","request":"req-…",
/// "method":"POST","route":"…","status":200,"code":"","execution":"exe-…","micros":2210},
/// "target":"turnstile::http"}`
fn json(buf: &mut Vec<u8>, l: &Line<'_>, level: Level, now: SystemTime) {
    buf.extend_from_slice(b"{\"timestamp\":\"");
    timestamp(buf, now);
    buf.extend_from_slice(b"\",\"level\":\"");
    buf.extend_from_slice(level.as_str().as_bytes());
    buf.extend_from_slice(b"\",\"fields\":{\"message\":\"request\",\"request\":");
    string(buf, l.request);
    buf.extend_from_slice(b",\"method\":");
    string(buf, l.method);
    buf.extend_from_slice(b",\"route\":");
    string(buf, l.route);
    buf.extend_from_slice(b",\"status\":");
    number(buf, l.status.into());
    buf.extend_from_slice(b",\"code\":");
    string(buf, l.code);
    buf.extend_from_slice(b",\"execution\":");
    string(buf, l.execution);
    buf.extend_from_slice(b",\"micros\":");
    number(buf, l.micros);
    buf.extend_from_slice(b"},\"target\":\"turnstile::http\"}\n");
}

fn string(buf: &mut Vec<u8>, s: &str) {
    // Cannot fail: writing to a Vec.
    let _ = serde_json::to_writer(&mut *buf, s);
}

fn number(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// RFC 3339 in UTC with microseconds, as the fmt layer's `SystemTime` timer writes it.
fn timestamp(buf: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (y, m, d) = civil(secs / 86_400);
    let s = secs % 86_400;
    let two = |buf: &mut Vec<u8>, n: u64, after: u8| {
        buf.extend_from_slice(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8, after]);
    };
    // Years from 1970 on have four digits.
    buf.extend_from_slice(itoa::Buffer::new().format(y).as_bytes());
    buf.push(b'-');
    two(buf, m, b'-');
    two(buf, d, b'T');
    two(buf, s / 3600, b':');
    two(buf, s / 60 % 60, b':');
    two(buf, s % 60, b'.');
    let micros = since.subsec_micros();
    for place in [100_000, 10_000, 1000, 100, 10, 1] {
        buf.push(b'0' + (micros / place % 10) as u8);
    }
    buf.push(b'Z');
}

/// The civil date of a day counted from 1970-01-01 (Howard Hinnant's `civil_from_days`,
/// for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn line() -> Line<'static> {
        Line {
            request: "req-3c21f49e61c430959ed591be49905337",
            method: "POST",
            route: "/v1/chat/completions",
            status: 200,
            code: "",
            execution: "exe-2b806c31418b4bbc1e992d833f443f40",
            micros: 2210,
        }
    }

    fn at(secs: u64, micros: u32) -> SystemTime {
        UNIX_EPOCH + Duration::new(secs, micros * 1000)
    }

    #[test]
    fn the_text_line_is_the_fmt_layers() {
        let mut buf = Vec::new();
        text(&mut buf, &line(), Level::INFO, at(1_796_616_604, 80_528));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "2026-12-07T04:10:04.080528Z  INFO turnstile::http: request \
             request=req-3c21f49e61c430959ed591be49905337 method=POST \
             route=/v1/chat/completions status=200 code=\"\" \
             execution=exe-2b806c31418b4bbc1e992d833f443f40 micros=2210\n"
        );
        let mut buf = Vec::new();
        let l = Line {
            status: 503,
            code: "backend_unavailable",
            execution: "",
            ..line()
        };
        text(&mut buf, &l, Level::ERROR, at(0, 7));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "1970-01-01T00:00:00.000007Z ERROR turnstile::http: request \
             request=req-3c21f49e61c430959ed591be49905337 method=POST \
             route=/v1/chat/completions status=503 code=\"backend_unavailable\" \
             execution= micros=2210\n"
        );
    }

    #[test]
    fn the_json_line_is_the_fmt_layers() {
        let mut buf = Vec::new();
        json(&mut buf, &line(), Level::INFO, at(1_796_616_604, 107_696));
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\"timestamp\":\"2026-12-07T04:10:04.107696Z\",\"level\":\"INFO\",\"fields\":{\
             \"message\":\"request\",\"request\":\"req-3c21f49e61c430959ed591be49905337\",\
             \"method\":\"POST\",\"route\":\"/v1/chat/completions\",\"status\":200,\"code\":\"\",\
             \"execution\":\"exe-2b806c31418b4bbc1e992d833f443f40\",\"micros\":2210},\
             \"target\":\"turnstile::http\"}\n"
        );
        let mut buf = Vec::new();
        let l = Line {
            route: "/a\"b\\",
            ..line()
        };
        json(&mut buf, &l, Level::DEBUG, at(0, 0));
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["fields"]["route"], "/a\"b\\");
        assert_eq!(v["level"], "DEBUG");
    }

    #[test]
    fn dates_are_civil_across_leap_years_and_centuries() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(11_017), (2000, 3, 1));
        assert_eq!(civil(20_794), (2026, 12, 7));
        assert_eq!(civil(47_540), (2100, 2, 28));
        assert_eq!(civil(47_541), (2100, 3, 1));
    }
}
