#!/usr/bin/env bash
# The replica load benchmark: `bench/replicas.sh` (not a test).
#
# Starts one PostgreSQL 15 (its defaults, durable commits included) in a temporary folder on
# a free loopback port, then `cargo bench --bench replicas`: one replica, then three, of the
# release gateway on it (see bench/replicas.rs for the load and what is reported).
#
# Environment: PG_BIN (/usr/lib/postgresql/15/bin), BENCH_PG_OPTIONS (more server settings,
# e.g. "-c synchronous_commit=off"), and what bench/replicas.rs reads
# (BENCH_CLIENTS, BENCH_SECONDS, BENCH_REPLICAS, BENCH_GATEWAY).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
WORK=$(mktemp -d)
PASSWORD="bench-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"

# PostgreSQL refuses to run as root.
as_owner() {
  if [ "$(id -u)" = 0 ]; then
    setpriv --reuid=nobody --regid=nogroup --clear-groups -- "$@"
  else
    "$@"
  fi
}
if [ "$(id -u)" = 0 ]; then chown nobody:nogroup "$WORK"; fi

cleanup() {
  as_owner "$PG_BIN/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

printf '%s' "$PASSWORD" >"$WORK/pw"
if [ "$(id -u)" = 0 ]; then chown nobody:nogroup "$WORK/pw"; fi
as_owner "$PG_BIN/initdb" -D "$WORK/data" -U turnstile --auth=scram-sha-256 \
  --pwfile="$WORK/pw" -E UTF8 --locale=C >/dev/null
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_owner "$PG_BIN/pg_ctl" -D "$WORK/data" -l "$WORK/log" -w -t 60 \
  -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c max_connections=300 ${BENCH_PG_OPTIONS:-}" start >/dev/null

export BENCH_PG_URL="postgres://turnstile@127.0.0.1:$PORT"
export BENCH_PG_PASSWORD="$PASSWORD"
export BENCH_CLUSTER_KEY="bench-cluster-key-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
cargo bench --manifest-path "$ROOT/Cargo.toml" --bench replicas
