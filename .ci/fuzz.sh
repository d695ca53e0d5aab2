#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ (see src/fuzzing.rs for the invariants):
# libFuzzer through `cargo fuzz` on the nightly toolchain, each target for
# TURNSTILE_FUZZ_SECONDS (default 20) on the committed seeds plus a scratch corpus kept in
# .cache/fuzz-corpus. Inputs are capped at 64 KiB, a single allocation at 512 MiB and the
# process at 2 GiB: going over is a finding. A finding fails the run, with its input under
# fuzz/artifacts/<target>/. Prints one line per target: runs, coverage, corpus, result.
# The stable test `fuzzing::tests::the_corpus_replays_clean` replays the seeds on every build.
set -uo pipefail
cd "$(dirname "$0")/.."
secs="${TURNSTILE_FUZZ_SECONDS:-20}"
targets=(chat responses messages ndjson sse config)
export PATH="$PWD/.cache/cargo-fuzz/bin:$PATH"
export CARGO_TARGET_DIR="$PWD/.cache/fuzz-target"

if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "!!!!! no nightly toolchain: coverage-guided fuzzing SKIPPED (the corpus replay still ran) !!!!!" >&2
  echo "fuzz: 0 passed, 0 failed"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  timeout 900 cargo install cargo-fuzz --locked --root .cache/cargo-fuzz --quiet || {
    echo "!!!!! cargo install cargo-fuzz FAILED !!!!!" >&2
    echo "fuzz: 0 passed, ${#targets[@]} failed"
    exit 1
  }
fi
echo "$(cargo fuzz --version), $(cargo +nightly --version)"
started=$SECONDS
# No sanitizer: the crate forbids unsafe code; what is looked for is panics, unbounded
# allocation and hangs, which libFuzzer sees without one (and the build is much shorter).
if ! cargo +nightly fuzz build -s none >/dev/null 2>"$CARGO_TARGET_DIR.build.log"; then
  tail -n 30 "$CARGO_TARGET_DIR.build.log" >&2
  echo "fuzz: 0 passed, ${#targets[@]} failed"
  exit 1
fi
echo "fuzz build: $((SECONDS - started)) s"
passed=0
failed=0
for t in "${targets[@]}"; do
  mkdir -p ".cache/fuzz-corpus/$t"
  log="$(mktemp)"
  if cargo +nightly fuzz run -s none "$t" ".cache/fuzz-corpus/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    result=ok
    passed=$((passed + 1))
  else
    result=FINDING
    failed=$((failed + 1))
    grep -E "panicked|ERROR: libFuzzer|Test unit written" "$log" | head -n 5 >&2
  fi
  runs=$(grep -Eo '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo "?")
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -n 1 || true)
  printf 'fuzz %-10s %8s runs in %ss  %s  %s\n' "$t" "$runs" "$secs" "${cov:-cov: ?}" "$result"
  rm -f "$log"
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
