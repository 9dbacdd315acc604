#!/usr/bin/env bash
# tests/fuzz/run.sh — a fuzzing campaign over every harness of tests/fuzz, each for SECONDS (default 60),
# from its committed seed corpus (tests/fuzz/corpus/<name>/, read only; new inputs go to a scratch copy).
# PARALLEL harnesses run at once (default 1; CI runs 2, one per core).
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLLMQ_FUZZ=ON -DLLMQ_CUDA=OFF && cmake --build build-fuzz -j2
#   tests/fuzz/run.sh build-fuzz 600        # ten minutes per harness
#   tests/fuzz/run.sh build-fuzz 60 2       # CI: a minute each, two at a time
# Exit status: 0 when no harness found anything, 1 otherwise (the crashing input is in the work folder).
set -u
build=$(cd "${1:-build-fuzz}" && pwd)
secs=${2:-60}
par=${3:-1}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/llmq-fuzz-run-XXXXXX)
export LLMQ_DATA=${LLMQ_DATA:-$src/../../../shared/datasets} # fuzz_imatrix loads stories260K from there

# one NAME EXE: fuzzes for secs; prints its report (or FINDING) when done; exit 1 on a finding.
one() {
  local name="$1" exe="$2" rc=0
  mkdir -p "$work/$name"
  cp -r "$src/corpus/$name/." "$work/$name/" 2>/dev/null || true
  (cd "$work" && "$exe" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
    "$work/$name" 2>"$work/$name.log") || rc=1
  {
    echo "== $name: ${secs} s"
    [ $rc -eq 0 ] || echo "FINDING in $name: see $work/$name.log"
    grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$work/$name.log" || true
  } >"$work/$name.report"
  cat "$work/$name.report"
  return $rc
}

fail=0
running=0
for exe in "$build"/tests/fuzz/fuzz_*; do
  one "$(basename "$exe")" "$exe" &
  running=$((running + 1))
  if [ "$running" -ge "$par" ]; then
    wait -n || fail=1
    running=$((running - 1))
  fi
done
while [ "$running" -gt 0 ]; do
  wait -n || fail=1
  running=$((running - 1))
done
echo "work folder: $work"
exit $fail
