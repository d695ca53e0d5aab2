#!/usr/bin/env bash
# The plain-relay A/B benchmark: `bench/run.sh` (not a test).
#
# A zero-delay mock upstream (nginx serving a canned Chat completion and a canned SSE body)
# answers either directly or through the gateway (release build, `kind = "openai"`), and oha
# loads both: closed loop at 1 and 16 connections, and open loop at a fixed rate with latency
# correction. oha runs on one CPU, nginx and the gateway on the other (`taskset`); direct and
# gateway rounds alternate, and each figure is the median of the rounds. The gateway's CPU per
# request comes from its process accounting (/proc/PID/stat) over the round. The Responses and
# Messages surfaces are measured through the same Chat upstream (their translation) and
# compared with the chat relay's CPU.
#
# A last load in agentgateway's published shape: a fixed 3,000 req/s from 32 connections with
# a 1 KB chat body for 30 s (BENCH_AG_SECONDS), p50/p90/p99 direct and through the gateway.
#
# Environment: BENCH_ROUNDS (3), BENCH_SECONDS per run (5), BENCH_RATE for the open loop
# (2000), BENCH_MODES (c1 c16 open ag), BENCH_LOAD_CPU (0) and BENCH_SERVER_CPU (1). Needs nginx (Debian's nginx-light) and
# oha (`cargo install oha --version 1.16.0 --locked`); it installs them when missing and it can.
set -euo pipefail

ROUNDS=${BENCH_ROUNDS:-3}
SECS=${BENCH_SECONDS:-5}
RATE=${BENCH_RATE:-2000}
AG_SECS=${BENCH_AG_SECONDS:-30}
LOAD_CPU=${BENCH_LOAD_CPU:-0}
SERVER_CPU=${BENCH_SERVER_CPU:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MOCK="$ROOT/bench/mock"

# shellcheck source=bench/tools.sh
. "$ROOT/bench/tools.sh"
need_nginx
need_oha

# BENCH_GATEWAY: another build of the gateway to measure (a before-and-after comparison).
GATEWAY=${BENCH_GATEWAY:-}
if [ -z "$GATEWAY" ]; then
  cargo build --release --bin turnstile --manifest-path "$ROOT/Cargo.toml" >&2
  GATEWAY="$ROOT/target/release/turnstile"
fi

WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/mock/nginx.sh
. "$MOCK/nginx.sh"
start_mock "$WORK" "$SERVER_CPU"
PIDS+=("$MOCK_PID")
NGINX_PORT=$MOCK_PORT
NGINX_WORKER=$MOCK_WORKER

# --- the gateway: one model per mock body, the default log level ----------------------------
KEY=sk-bench
KEY_SHA=$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)
cat >"$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"
[store]
path = "$WORK/gateway.db"
[[clients]]
id = "bench"
key_sha256 = "$KEY_SHA"
[[models]]
id = "mock"
backend = "json"
[[models]]
id = "mock-sse"
backend = "sse"
[backends.json]
kind = "openai"
base_url = "http://127.0.0.1:$NGINX_PORT/json/v1"
max_idle_connections = 256
[backends.sse]
kind = "openai"
base_url = "http://127.0.0.1:$NGINX_PORT/sse/v1"
max_idle_connections = 256
EOF
mkfifo "$WORK/announce"
taskset -c "$SERVER_CPU" "$GATEWAY" serve --config "$WORK/gateway.toml" \
  >"$WORK/announce" 2>/dev/null &
GATEWAY_PID=$!
PIDS+=($GATEWAY_PID)
read -r -t 30 LINE <"$WORK/announce"
GW_URL=${LINE#listening on }
cat "$WORK/announce" >/dev/null &

DIRECT_JSON="http://127.0.0.1:$NGINX_PORT/json/v1/chat/completions"
DIRECT_SSE="http://127.0.0.1:$NGINX_PORT/sse/v1/chat/completions"
printf '{"model":"mock","messages":[{"role":"user","content":"Say hello."}]}' >"$WORK/chat.json"
# agentgateway's 1 KB body: a chat request padded to 1,024 bytes.
python3 -c 'import json,sys; b={"model":"mock","messages":[{"role":"user","content":""}]}; n=1024-len(json.dumps(b,separators=(",",":"))); b["messages"][0]["content"]="x"*n; sys.stdout.write(json.dumps(b,separators=(",",":")))' >"$WORK/chat-1k.json"
printf '{"model":"mock-sse","stream":true,"messages":[{"role":"user","content":"Say hello."}]}' >"$WORK/chat-sse.json"
printf '{"model":"mock","input":"Say hello."}' >"$WORK/responses.json"
printf '{"model":"mock","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}' >"$WORK/messages.json"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# run SCENARIO MODE URL BODY CPU_PID: one oha run, one result line in $WORK/results.
run() {
  local scenario=$1 mode=$2 url=$3 body=$4 pid=$5 args secs=$SECS
  case $mode in
    c1) args=(-c 1) ;;
    c16) args=(-c 16) ;;
    open) args=(-c 64 -q "$RATE" --latency-correction) ;;
    ag) args=(-c 32 -q 3000 --latency-correction) secs=$AG_SECS ;;
  esac
  local before after
  before=$(cpu_ticks "$pid")
  taskset -c "$LOAD_CPU" "$OHA" --no-tui --output-format json -z "${secs}s" "${args[@]}" \
    -m POST -H "authorization: Bearer $KEY" -H "anthropic-version: 2023-06-01" \
    -T application/json -D "$body" "$url" >"$WORK/oha.json"
  after=$(cpu_ticks "$pid")
  python3 - "$scenario" "$mode" "$((after - before))" "$WORK/oha.json" >>"$WORK/results" <<'EOF'
import json, sys
scenario, mode, ticks, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
r = json.load(open(path))
ok = r["statusCodeDistribution"].get("200", 0)
bad = sum(v for k, v in r["statusCodeDistribution"].items() if k != "200")
# A request cut off by the end of the run is not an error.
bad += sum(v for k, v in r.get("errorDistribution", {}).items() if "deadline" not in k)
p = r["latencyPercentiles"]
cpu_us = ticks * 10_000 / max(ok, 1)  # USER_HZ is 100
print(scenario, mode, p["p50"] * 1e3, p["p90"] * 1e3, p["p99"] * 1e3, r["summary"]["requestsPerSec"], cpu_us, ok, bad)
EOF
}

# Warm both paths (connection pools, allocator, caches).
SECS_SAVED=$SECS
SECS=1
run warm c16 "$DIRECT_JSON" "$WORK/chat.json" "$NGINX_WORKER"
run warm c16 "$GW_URL/v1/chat/completions" "$WORK/chat.json" "$GATEWAY_PID"
run warm c16 "$GW_URL/v1/chat/completions" "$WORK/chat-sse.json" "$GATEWAY_PID"
run warm c16 "$GW_URL/v1/responses" "$WORK/responses.json" "$GATEWAY_PID"
run warm c16 "$GW_URL/v1/messages" "$WORK/messages.json" "$GATEWAY_PID"
SECS=$SECS_SAVED
: >"$WORK/results"

# BENCH_PROFILE=chat|chat-sse|responses|messages: a flat CPU profile of the gateway during one
# run at 16 connections (perf, software clock), written to target/bench-profile-SCENARIO.txt.
if [ -n "${BENCH_PROFILE:-}" ]; then
  case $BENCH_PROFILE in
    chat) url=/v1/chat/completions body=chat.json ;;
    chat-sse) url=/v1/chat/completions body=chat-sse.json ;;
    responses) url=/v1/responses body=responses.json ;;
    messages) url=/v1/messages body=messages.json ;;
  esac
  perf record -e cpu-clock -F 999 --call-graph dwarf,32768 -o "$WORK/perf.data" -p "$GATEWAY_PID" -- sleep "$SECS" 2>/dev/null &
  PERF=$!
  run "$BENCH_PROFILE" c16 "$GW_URL$url" "$WORK/$body" "$GATEWAY_PID"
  wait "$PERF" || true
  out="$ROOT/target/bench-profile-$BENCH_PROFILE.txt"
  cp "$WORK/perf.data" "$ROOT/target/bench-profile-$BENCH_PROFILE.data"
  for sort in dso dso,symbol; do
    perf report -i "$WORK/perf.data" --no-children --sort "$sort" --stdio 2>/dev/null \
      | grep -v '^#' | grep -v '^$' | sed -e 's/ *$//' | head -80
  done >"$out"
  echo "profile: $out" >&2
  exit 0
fi

echo "bench/run.sh: $ROUNDS rounds of ${SECS} s per run, open loop at $RATE req/s; oha on CPU $LOAD_CPU, servers on CPU $SERVER_CPU" >&2
SCENARIOS=${BENCH_SCENARIOS:-chat chat-sse responses messages}
MODES=${BENCH_MODES:-c1 c16 open ag}
has() { [[ " $SCENARIOS " == *" $1 "* ]]; }
for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for mode in $MODES; do
    if [ "$mode" = ag ]; then
      run direct-1k ag "$DIRECT_JSON" "$WORK/chat-1k.json" "$NGINX_WORKER"
      run chat-1k ag "$GW_URL/v1/chat/completions" "$WORK/chat-1k.json" "$GATEWAY_PID"
      continue
    fi
    run direct "$mode" "$DIRECT_JSON" "$WORK/chat.json" "$NGINX_WORKER"
    has chat && run chat "$mode" "$GW_URL/v1/chat/completions" "$WORK/chat.json" "$GATEWAY_PID"
    if has chat-sse; then
      run direct-sse "$mode" "$DIRECT_SSE" "$WORK/chat-sse.json" "$NGINX_WORKER"
      run chat-sse "$mode" "$GW_URL/v1/chat/completions" "$WORK/chat-sse.json" "$GATEWAY_PID"
    fi
    has responses && run responses "$mode" "$GW_URL/v1/responses" "$WORK/responses.json" "$GATEWAY_PID"
    has messages && run messages "$mode" "$GW_URL/v1/messages" "$WORK/messages.json" "$GATEWAY_PID"
  done
done

python3 - "$WORK/results" "$RATE" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    s, m, p50, p90, p99, rps, cpu, ok, bad = line.split()
    rows.setdefault((s, m), []).append((float(p50), float(p99), float(rps), float(cpu), int(bad), float(p90)))
med = lambda xs: statistics.median(xs)
def fig(s, m):
    r = rows[(s, m)]
    return tuple(med([x[i] for x in r]) for i in range(4)) + (sum(x[4] for x in r), med([x[5] for x in r]))
modes = {"c1": "closed, 1 conn", "c16": "closed, 16 conn", "open": f"open, {sys.argv[2]} req/s"}
base = {"chat": "direct", "chat-sse": "direct-sse", "responses": "direct", "messages": "direct"}
print("| surface | load | direct p50 | gateway p50 | added p50 | direct p99 | gateway p99 | added p99 | gateway req/s | gateway CPU/req | CPU vs chat | errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in ("c1", "c16", "open"):
    for s in ("chat", "chat-sse", "responses", "messages"):
        if (s, m) not in rows:
            continue
        d, g = fig(base[s], m), fig(s, m)
        chat_cpu = fig("chat", m)[3] if ("chat", m) in rows else float("nan")
        vs = "" if s == "chat" else f"{g[3] / chat_cpu:.2f}x"
        print(f"| {s} | {modes[m]} | {d[0]:.3f} ms | {g[0]:.3f} ms | {(g[0]-d[0])*1e3:+.0f} µs ({g[0]/d[0]:.2f}x) "
              f"| {d[1]:.3f} ms | {g[1]:.3f} ms | {(g[1]-d[1])*1e3:+.0f} µs ({g[1]/d[1]:.2f}x) "
              f"| {g[2]:.0f} | {g[3]:.0f} µs | {vs} | {g[4] + d[4]} |")
if ("chat-1k", "ag") in rows:
    d, g = fig("direct-1k", "ag"), fig("chat-1k", "ag")
    print("\nagentgateway's shape (fixed 3,000 req/s, 32 connections, 1 KB body):\n")
    print("| | p50 | p90 | p99 | req/s | gateway CPU/req | errors |")
    print("|---|---|---|---|---|---|---|")
    print(f"| direct | {d[0]:.3f} ms | {d[5]:.3f} ms | {d[1]:.3f} ms | {d[2]:.0f} | | {d[4]} |")
    print(f"| gateway | {g[0]:.3f} ms | {g[5]:.3f} ms | {g[1]:.3f} ms | {g[2]:.0f} | {g[3]:.0f} µs | {g[4]} |")
    print(f"| added | {(g[0]-d[0])*1e3:+.0f} µs | {(g[5]-d[5])*1e3:+.0f} µs | {(g[1]-d[1])*1e3:+.0f} µs | | | |")
if ("direct", "c16") in rows:
    d = fig("direct", "c16")
    print(f"\nnginx itself at 16 connections: {d[3]:.1f} µs of CPU per request, {d[2]:.0f} req/s.")
print("Medians of the rounds; CPU per request from the process's utime+stime over the run.")
EOF
