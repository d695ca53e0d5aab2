//! Metric names and Prometheus text rendering.
//!
//! Hand-written on purpose: a dozen counters, gauges and two histograms need no global
//! registry or extra dependency tree; everything here is lock-free atomics except the label
//! maps (request and rejection counters), which take a short std lock and never await.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::turn::Usage;

/// Bucket upper bounds in seconds (shared by both histograms).
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        self.render_labeled(name, help, "", out)
    }

    /// With `labels` (`key="value"`, or empty) on every line of the series.
    pub fn render_labeled(&self, name: &str, help: &str, labels: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {}",
                self.counts[i].load(Ordering::Relaxed)
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(
            out,
            "{name}_sum{braces} {sum}\n{name}_count{braces} {count}"
        );
    }
}

#[derive(Default)]
pub struct Metrics {
    /// By route, then status (nested so that counting looks up by `&str`, allocating a key
    /// only the first time a route is seen).
    requests: Mutex<BTreeMap<String, BTreeMap<u16, u64>>>,
    rejections: Mutex<BTreeMap<&'static str, u64>>,
    endings: Mutex<BTreeMap<&'static str, u64>>,
    /// Tokens the backends reported, by (client, model).
    tokens: Mutex<BTreeMap<String, BTreeMap<String, Usage>>>,
    /// Continuity lookups by (result, reason): `("hit", "")`, `("miss", reason)`, and
    /// idle threads released by (`"released"`, reason).
    continuity: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Spend of priced models in nano-USD, by model (never by principal).
    spend: Mutex<BTreeMap<String, u64>>,
    /// Turns refused or stopped by a budget cap, by cap.
    budget_refusals: Mutex<BTreeMap<&'static str, u64>>,
    /// Time the gateway itself spends on a request before the backend is engaged.
    pub overhead: Histogram,
    /// Request start to the first response byte.
    pub ttfb: Histogram,
    /// Replicas: forwarding to an owner, leases.
    pub cluster: ClusterMetrics,
}

/// What a replica counts of the others.
#[derive(Default)]
pub struct ClusterMetrics {
    /// Requests forwarded to their owner replica, by (what, status of the owner's answer;
    /// 0 when the owner could not be reached).
    forwarded: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Sending a forwarded request to the owner's answer head.
    pub forwarding: Histogram,
    /// Lease renewals by outcome (`ok`, `fenced`, `error`).
    renewals: Mutex<BTreeMap<&'static str, u64>>,
    /// Replicas with a live lease, this one included, at the last renewal.
    pub replicas_seen: AtomicU64,
    /// Lapsed replicas this one settled.
    pub replicas_settled: AtomicU64,
}

impl ClusterMetrics {
    pub fn forwarded(&self, what: &'static str, status: u16, took: Duration) {
        *self.forwarded.lock().entry((what, status)).or_default() += 1;
        self.forwarding.observe(took);
    }

    pub fn renewal(&self, outcome: &'static str) {
        *self.renewals.lock().entry(outcome).or_default() += 1;
    }

    fn render(&self, out: &mut String) {
        out.push_str("# HELP turnstile_forwarded_total Requests forwarded to the replica that owns their held turn, approval or session, by kind and the owner's status (0: unreachable).\n# TYPE turnstile_forwarded_total counter\n");
        for ((what, status), n) in self.forwarded.lock().iter() {
            let _ = writeln!(
                out,
                "turnstile_forwarded_total{{kind=\"{what}\",status=\"{status}\"}} {n}"
            );
        }
        self.forwarding.render(
            "turnstile_forwarding_seconds",
            "Forwarding a request to its owner replica, until the owner's answer head.",
            out,
        );
        out.push_str("# HELP turnstile_lease_renewals_total Lease renewals of this replica, by outcome.\n# TYPE turnstile_lease_renewals_total counter\n");
        for (outcome, n) in self.renewals.lock().iter() {
            let _ = writeln!(
                out,
                "turnstile_lease_renewals_total{{outcome=\"{outcome}\"}} {n}"
            );
        }
        let seen = self.replicas_seen.load(Ordering::Relaxed);
        let settled = self.replicas_settled.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "# HELP turnstile_replicas_seen Replicas with a live lease at the last renewal.\n# TYPE turnstile_replicas_seen gauge\nturnstile_replicas_seen {seen}\n# HELP turnstile_replicas_settled_total Replicas whose lapsed lease this one settled.\n# TYPE turnstile_replicas_settled_total counter\nturnstile_replicas_settled_total {settled}"
        );
    }
}

/// Point-in-time values read from the live state when rendering.
#[derive(Default)]
pub struct Gauges {
    pub suspended_executions: usize,
    pub pending_continuations: usize,
    pub tombstones: usize,
    pub pending_approvals: usize,
    /// (backend, busy, capacity)
    pub sessions: Vec<(String, usize, usize)>,
    /// Backend threads kept idle for their conversation's next turn.
    pub idle_threads: usize,
    /// Round trips to the database server since start (PostgreSQL; 0 on SQLite).
    pub store_round_trips: u64,
}

/// A label value with `\`, `"` and newlines escaped (client and model ids come from config).
fn label(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return std::borrow::Cow::Borrowed(v);
    }
    std::borrow::Cow::Owned(
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n"),
    )
}

/// The value under `key`, allocating the key only the first time it is seen (the hot paths
/// count under a handful of known keys).
pub(crate) fn slot<'m, V: Default>(m: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !m.contains_key(key) {
        m.insert(key.to_string(), V::default());
    }
    m.get_mut(key).expect("inserted above")
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16) {
        let mut m = self.requests.lock();
        *slot(&mut m, route).entry(status).or_default() += 1;
    }

    pub fn rejection(&self, code: &'static str) {
        let mut m = self.rejections.lock();
        *m.entry(code).or_default() += 1;
    }

    /// An execution ended, by reason.
    pub fn ended(&self, reason: &'static str) {
        let mut m = self.endings.lock();
        *m.entry(reason).or_default() += 1;
    }

    /// A backend reported usage for one model request of this client and model.
    pub fn tokens(&self, client: &str, model: &str, u: Usage) {
        let mut m = self.tokens.lock();
        slot(slot(&mut m, client), model).add(u);
    }

    /// A priced model request's cost, in nano-USD.
    pub fn spend(&self, model: &str, nanos: u64) {
        *slot(&mut self.spend.lock(), model) += nanos;
    }

    /// A fresh turn refused, or an execution stopped, by this budget cap.
    pub fn budget_refusal(&self, cap: &'static str) {
        *self.budget_refusals.lock().entry(cap).or_default() += 1;
    }

    /// A continuity outcome: `hit`, `miss` (with its reason) or `released` (with why).
    pub fn continuity(&self, result: &'static str, reason: &'static str) {
        let mut m = self.continuity.lock();
        *m.entry((result, reason)).or_default() += 1;
    }

    /// The Prometheus text. Only `clients` (an approver's scrape) names principals: without
    /// it `turnstile_tokens_total` is summed over clients, by model and kind.
    pub fn render(&self, g: &Gauges, clients: bool) -> String {
        let mut out = String::new();
        out.push_str("# HELP turnstile_requests_total HTTP requests by route and status.\n# TYPE turnstile_requests_total counter\n");
        let requests = self.requests.lock();
        let requests = requests
            .iter()
            .flat_map(|(route, m)| m.iter().map(move |(status, n)| (route, status, n)));
        for (route, status, n) in requests {
            let _ = writeln!(
                out,
                "turnstile_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str("# HELP turnstile_continuation_rejections_total Rejected continuations by error code.\n# TYPE turnstile_continuation_rejections_total counter\n");
        for (code, n) in self.rejections.lock().iter() {
            let _ = writeln!(
                out,
                "turnstile_continuation_rejections_total{{code=\"{code}\"}} {n}"
            );
        }
        out.push_str("# HELP turnstile_executions_ended_total Executions ended, by reason.\n# TYPE turnstile_executions_ended_total counter\n");
        for (reason, n) in self.endings.lock().iter() {
            let _ = writeln!(
                out,
                "turnstile_executions_ended_total{{reason=\"{reason}\"}} {n}"
            );
        }
        out.push_str("# HELP turnstile_tokens_total Tokens the backends reported, by client (an approver's scrape only), model and kind (input includes cached_input; output includes reasoning).\n# TYPE turnstile_tokens_total counter\n");
        let tokens = self.tokens.lock();
        let mut summed: BTreeMap<&str, BTreeMap<&str, Usage>> = BTreeMap::new();
        for (client, m) in tokens.iter() {
            let client = if clients { client.as_str() } else { "" };
            let per_model = summed.entry(client).or_default();
            for (model, u) in m {
                per_model.entry(model.as_str()).or_default().add(*u);
            }
        }
        let tokens = summed
            .iter()
            .flat_map(|(client, m)| m.iter().map(move |(model, u)| (client, model, u)));
        for (client, model, u) in tokens {
            let model = label(model);
            let client = if clients {
                format!("client=\"{}\",", label(client))
            } else {
                String::new()
            };
            for (kind, n) in [
                ("input", u.prompt_tokens),
                ("cached_input", u.cached_tokens),
                ("cache_write_input", u.cache_write_tokens),
                ("output", u.completion_tokens),
                ("reasoning", u.reasoning_tokens),
            ] {
                let _ = writeln!(
                    out,
                    "turnstile_tokens_total{{{client}model=\"{model}\",kind=\"{kind}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP turnstile_spend_usd_total What priced models' usage cost, in USD, by model.\n# TYPE turnstile_spend_usd_total counter\n");
        for (model, nanos) in self.spend.lock().iter() {
            let usd = crate::budget::usd(*nanos);
            let _ = writeln!(
                out,
                "turnstile_spend_usd_total{{model=\"{}\"}} {usd}",
                label(model)
            );
        }
        out.push_str("# HELP turnstile_budget_refusals_total Fresh turns refused and executions stopped by a budget cap, by cap.\n# TYPE turnstile_budget_refusals_total counter\n");
        for (cap, n) in self.budget_refusals.lock().iter() {
            let _ = writeln!(out, "turnstile_budget_refusals_total{{cap=\"{cap}\"}} {n}");
        }
        let continuity = self.continuity.lock();
        out.push_str("# HELP turnstile_continuity_hits_total Fresh requests that continued a kept backend thread.\n# TYPE turnstile_continuity_hits_total counter\n");
        let hits = continuity.get(&("hit", "")).copied().unwrap_or(0);
        let _ = writeln!(out, "turnstile_continuity_hits_total {hits}");
        for (result, name, help) in [
            (
                "miss",
                "turnstile_continuity_misses_total",
                "Follow-up requests that got a fresh thread, by reason.",
            ),
            (
                "released",
                "turnstile_continuity_released_total",
                "Idle threads released, by reason.",
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((_, reason), n) in continuity.iter().filter(|((r, _), _)| *r == result) {
                let _ = writeln!(out, "{name}{{reason=\"{reason}\"}} {n}");
            }
        }
        drop(continuity);
        self.overhead.render(
            "turnstile_gateway_overhead_seconds",
            "Gateway time per request before the backend is engaged (parsing, auth, digests, validation, claim).",
            &mut out,
        );
        self.ttfb.render(
            "turnstile_time_to_first_byte_seconds",
            "Request start to the first response byte.",
            &mut out,
        );
        self.cluster.render(&mut out);
        if crate::telemetry::on() {
            let (exported, full, failed) = crate::telemetry::counts();
            let _ = writeln!(
                out,
                "# HELP turnstile_trace_spans_exported_total Spans the trace collector accepted.\n# TYPE turnstile_trace_spans_exported_total counter\nturnstile_trace_spans_exported_total {exported}\n# HELP turnstile_trace_spans_dropped_total Spans dropped, by reason: the export queue was full, or their export failed.\n# TYPE turnstile_trace_spans_dropped_total counter\nturnstile_trace_spans_dropped_total{{reason=\"queue_full\"}} {full}\nturnstile_trace_spans_dropped_total{{reason=\"export_failed\"}} {failed}"
            );
        }
        let gauge = |out: &mut String, name: &str, help: &str, v: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        gauge(
            &mut out,
            "turnstile_suspended_executions",
            "Executions suspended on client tool calls.",
            g.suspended_executions,
        );
        gauge(
            &mut out,
            "turnstile_pending_continuations",
            "Continuation tokens awaiting results.",
            g.pending_continuations,
        );
        gauge(
            &mut out,
            "turnstile_tombstones",
            "Tombstoned continuation tokens held in memory.",
            g.tombstones,
        );
        gauge(
            &mut out,
            "turnstile_pending_approvals",
            "Approvals waiting for a decision.",
            g.pending_approvals,
        );
        gauge(
            &mut out,
            "turnstile_continuity_idle_threads",
            "Backend threads kept idle for their conversation's next turn.",
            g.idle_threads,
        );
        let _ = writeln!(
            out,
            "# HELP turnstile_store_round_trips_total Round trips to the database server (PostgreSQL).\n\
             # TYPE turnstile_store_round_trips_total counter\nturnstile_store_round_trips_total {}",
            g.store_round_trips
        );
        out.push_str("# HELP turnstile_backend_sessions Backend sessions by state.\n# TYPE turnstile_backend_sessions gauge\n");
        for (b, busy, cap) in &g.sessions {
            let _ = writeln!(
                out,
                "turnstile_backend_sessions{{backend=\"{b}\",state=\"busy\"}} {busy}"
            );
            let _ = writeln!(
                out,
                "turnstile_backend_sessions{{backend=\"{b}\",state=\"idle\"}} {}",
                cap - busy
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.request("/v1/chat/completions", 200);
        m.request("/v1/chat/completions", 200);
        m.rejection("continuation_mismatch");
        m.ended("completed");
        m.continuity("miss", "unknown");
        m.continuity("hit", "");
        let u = Usage {
            prompt_tokens: 10,
            cached_tokens: 4,
            ..Usage::default()
        };
        m.tokens("al\"ice", "codex", u);
        m.overhead.observe(Duration::from_micros(300));
        let text = m.render(
            &Gauges {
                suspended_executions: 1,
                pending_continuations: 2,
                tombstones: 3,
                pending_approvals: 0,
                sessions: vec![("demo".into(), 1, 16)],
                idle_threads: 2,
                store_round_trips: 7,
            },
            true,
        );
        assert!(text
            .contains("turnstile_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 2"));
        assert!(text
            .contains("turnstile_continuation_rejections_total{code=\"continuation_mismatch\"} 1"));
        assert!(text.contains("turnstile_executions_ended_total{reason=\"completed\"} 1"));
        assert!(text.contains("turnstile_gateway_overhead_seconds_bucket{le=\"0.00025\"} 0"));
        assert!(text.contains("turnstile_gateway_overhead_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(text.contains("turnstile_gateway_overhead_seconds_count 1"));
        assert!(text.contains("turnstile_backend_sessions{backend=\"demo\",state=\"idle\"} 15"));
        assert!(text.contains("turnstile_pending_continuations 2"));
        assert!(text.contains("turnstile_continuity_idle_threads 2"));
        assert!(text.contains("turnstile_store_round_trips_total 7"));
        assert!(text.contains("turnstile_continuity_hits_total 1"));
        assert!(text.contains("turnstile_continuity_misses_total{reason=\"unknown\"} 1"));
        assert!(text.contains(
            "turnstile_tokens_total{client=\"al\\\"ice\",model=\"codex\",kind=\"cached_input\"} 4"
        ));
        let public = m.render(&Gauges::default(), false);
        assert!(public.contains("turnstile_tokens_total{model=\"codex\",kind=\"cached_input\"} 4"));
        assert!(!public.contains("al\\\"ice"), "{public}");
        m.spend("codex", 1_500_000_000);
        m.budget_refusal("usd_per_day");
        let public = m.render(&Gauges::default(), false);
        assert!(
            public.contains("turnstile_spend_usd_total{model=\"codex\"} 1.5"),
            "{public}"
        );
        assert!(public.contains("turnstile_budget_refusals_total{cap=\"usd_per_day\"} 1"));
    }
}
