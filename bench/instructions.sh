#!/usr/bin/env bash
# Instructions the gateway executes per request, by callgrind (not a test):
# `bench/instructions.sh [chat|chat-sse|responses|messages|gemini|agent|agent-tool|resume-100k]`
# (`BENCH_BUDGET=1` prices the models and puts the client under budgets; `BENCH_TRACE=on`
# exports every request's traces, sampled 100%, to the mock's OTLP receiver, and
# `BENCH_TRACE=dead` to a port where nothing listens).
#
# chat … gemini: the plain relay to the nginx mock (`kind = "openai"`). agent: a plain turn
# on the demo backend (`kind = "app-server"`, its processes outside valgrind); agent-tool: a
# tool round trip there (the request that suspends plus its continuation, counted as one);
# resume-100k: that round trip with a 100 KB conversation.
#
# Wall-clock CPU figures on a shared machine move by 20% between runs; instruction counts do
# not (the same binary and inputs give the same count), so this is the figure to compare a
# change by. The gateway runs under valgrind in front of the same nginx mock as bench/run.sh;
# after a warm-up the counters are zeroed, BENCH_REQUESTS requests (default 2000) are sent
# from 4 connections, and the total is divided by the count. User space only: the kernel's
# share (sockets, wake-ups) is not counted. The annotated profile (inclusive, by function) is
# written to target/instructions-SCENARIO.txt.
set -euo pipefail

SCENARIO=${1:-chat}
N=${BENCH_REQUESTS:-2000}
WARM=300
case $SCENARIO in
  agent*|resume*) N=${BENCH_REQUESTS:-300} WARM=30 ;;
esac
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MOCK="$ROOT/bench/mock"
# shellcheck source=bench/tools.sh
. "$ROOT/bench/tools.sh"
need_nginx
case ${BENCH_TOOL:-callgrind} in
  cpu) need_package perf linux-perf ;;
  *) need_package valgrind valgrind ;;
esac
case $SCENARIO in
  chat|chat-sse|responses|messages|gemini) need_oha ;;
  agent|agent-tool|resume-100k) ;;
  *) echo "bench/instructions.sh: unknown scenario $SCENARIO" >&2; exit 2 ;;
esac
# BENCH_BUDGET=1: every model priced and the client under every budget cap (none reached),
# to count what budgets cost against the same run without them.
BUDGET=""
PRICE=""
if [ -n "${BENCH_BUDGET:-}" ]; then
  BUDGET='budget = { usd_per_day = 1000000.0, usd_per_month = 1000000.0, tokens_per_day = 1000000000000, usd_per_execution = 1000000.0 }'
  PRICE='price = { input_per_mtok = 1.25, cached_input_per_mtok = 0.125, output_per_mtok = 10.0 }'
fi
# BENCH_GATEWAY: another build of the gateway to count (a before-and-after comparison).
GATEWAY=${BENCH_GATEWAY:-}
if [ -z "$GATEWAY" ]; then
  cargo build --release --bin turnstile --manifest-path "$ROOT/Cargo.toml" >&2
  GATEWAY="$ROOT/target/release/turnstile"
fi
DEMO="$ROOT/target/release/turnstile-demo-backend"
case $SCENARIO in
  agent*|resume*) cargo build --release --bin turnstile-demo-backend --manifest-path "$ROOT/Cargo.toml" >&2 ;;
esac

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
start_mock "$WORK" ""
PIDS+=("$MOCK_PID")
PORT=$MOCK_PORT

KEY=sk-bench
TELEMETRY=""
case ${BENCH_TRACE:-} in
  on) TELEMETRY="[telemetry]
otlp_endpoint = \"http://127.0.0.1:$PORT\"" ;;
  dead) TELEMETRY="[telemetry]
otlp_endpoint = \"http://127.0.0.1:$(free_port)\"" ;;
esac
cat >"$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"
max_body_bytes = 16777216
[store]
path = "$WORK/gateway.db"
[[clients]]
id = "bench"
key_sha256 = "$(printf %s "$KEY" | sha256sum | cut -d' ' -f1)"
$BUDGET
[[models]]
id = "mock"
backend = "json"
$PRICE
[[models]]
id = "mock-sse"
backend = "sse"
$PRICE
[backends.json]
kind = "openai"
base_url = "http://127.0.0.1:$PORT/json/v1"
[backends.sse]
kind = "openai"
base_url = "http://127.0.0.1:$PORT/sse/v1"
[[models]]
id = "echo"
backend = "demo"
backend_model = "echo"
$PRICE
[[models]]
id = "tool"
backend = "demo"
backend_model = "tool"
$PRICE
[backends.demo]
kind = "app-server"
command = ["$DEMO"]
max_sessions = 64
processes = 2
$TELEMETRY
EOF
mkfifo "$WORK/announce"
# BENCH_TOOL=cpu: no valgrind; the gateway's own CPU time per request (user and system, from
# /proc, noisy on a shared machine) and a perf profile of the same requests.
TOOL=${BENCH_TOOL:-callgrind}
if [ "$TOOL" = cpu ]; then
  "$GATEWAY" serve --config "$WORK/gateway.toml" >"$WORK/announce" 2>/dev/null &
else
  valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
    "$GATEWAY" serve --config "$WORK/gateway.toml" \
    >"$WORK/announce" 2>"$WORK/valgrind.log" &
fi
GW=$!
PIDS+=($GW)
read -r -t 120 LINE <"$WORK/announce"
URL=${LINE#listening on }
cat "$WORK/announce" >/dev/null &

case $SCENARIO in
  chat) path=/v1/chat/completions body='{"model":"mock","messages":[{"role":"user","content":"Say hello."}]}' ;;
  chat-sse) path=/v1/chat/completions body='{"model":"mock-sse","stream":true,"messages":[{"role":"user","content":"Say hello."}]}' ;;
  responses) path=/v1/responses body='{"model":"mock","input":"Say hello."}' ;;
  messages) path=/v1/messages body='{"model":"mock","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}' ;;
  gemini) path=/v1beta/models/mock:generateContent body='{"contents":[{"role":"user","parts":[{"text":"Say hello."}]}]}' ;;
esac
# The held-turn scenarios: sequential requests on one kept-alive connection.
drive() {
  BENCH_PATH=${path:-} BENCH_BODY=${body:-} python3 - "$URL" "$KEY" "$SCENARIO" "$1" <<'PY'
import http.client, json, os, sys, threading, urllib.parse
url, key, scenario, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
u = urllib.parse.urlparse(url)
local = threading.local()
def post(body, path="/v1/chat/completions"):
    if not hasattr(local, "conn"):
        local.conn = http.client.HTTPConnection(u.hostname, u.port)
    conn = local.conn
    conn.request("POST", path, body if isinstance(body, str) else json.dumps(body),
                 {"authorization": "Bearer " + key, "content-type": "application/json",
                  "anthropic-version": "2023-06-01"})
    r = conn.getresponse()
    data = r.read()
    streamed = r.getheader("content-type", "").startswith("text/event-stream")
    return r.status, json.loads(data) if r.status == 200 and not streamed else None
tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
pad = "x" * 100_000 if scenario == "resume-100k" else ""
def one(i):
    if os.environ["BENCH_PATH"]:
        return post(os.environ["BENCH_BODY"], os.environ["BENCH_PATH"])[0] == 200
    if scenario == "agent":
        s, _ = post({"model": "echo", "messages": [{"role": "user", "content": "hello"}]})
        return s == 200
    msgs = [{"role": "user", "content": f"{pad} read /tmp/f{i}"}]
    s, a = post({"model": "tool", "messages": msgs, "tools": tools})
    if s != 200:
        return False
    m = a["choices"][0]["message"]
    msgs += [{"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]},
             {"role": "tool", "tool_call_id": m["tool_calls"][0]["id"], "content": "contents"}]
    s, b = post({"model": "tool", "messages": msgs, "tools": tools})
    return s == 200 and b["choices"][0]["finish_reason"] == "stop"
# Four clients at once, as oha's four connections on the relay scenarios.
ok = [0] * 4
def client(k):
    for i in range(k, n, 4):
        done = one(i)
        ok[k] += done
threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(sum(ok))
PY
}
# The relays go through oha, the held turns through the Python client above.
load() {
  case $SCENARIO in
    agent*|resume*) drive "$1"; return ;;
  esac
  "$OHA" --no-tui --output-format json -n "$1" -c 4 -m POST -H "authorization: Bearer $KEY" \
    -H "anthropic-version: 2023-06-01" -T application/json -d "$body" "$URL$path" >"$WORK/oha.json"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["statusCodeDistribution"].get("200",0))' "$WORK/oha.json"
}
load "$WARM" >/dev/null
if [ "$TOOL" = cpu ]; then
  ticks() { awk '{print $14 + $15}' "/proc/$GW/stat"; }
  perf record -e cpu-clock -F 999 -g --call-graph dwarf,16384 -o "$WORK/perf.data" -p "$GW" 2>/dev/null &
  PERF=$!
  before=$(ticks)
  ok=$(load "$N")
  after=$(ticks)
  kill -INT "$PERF"
  wait "$PERF" 2>/dev/null || true
  perf report -i "$WORK/perf.data" --children --sort symbol --stdio -g none --percent-limit 1 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | cut -c1-200 >"$ROOT/target/cpu-$SCENARIO.txt" || true
  echo "$SCENARIO: $ok requests, $(( (after - before) * 10000 / ok )) µs of gateway CPU per request (profile: target/cpu-$SCENARIO.txt)"
  exit 0
fi
callgrind_control -z "$GW" >/dev/null
ok=$(load "$N")
callgrind_control -d "$GW" >/dev/null
dump=$(ls -t "$WORK"/cg.out* | head -1)
cp "$dump" "$ROOT/target/instructions-$SCENARIO.out"
total=$(grep -m1 '^summary:\|^totals:' "$dump" | awk '{print $2}')
(callgrind_annotate --inclusive=yes "$dump" 2>/dev/null || true) | head -120 >"$ROOT/target/instructions-$SCENARIO.txt" || true
echo "$SCENARIO: $ok requests, $((total / ok)) instructions per request (user space)"
