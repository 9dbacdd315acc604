#!/usr/bin/env bash
# tests/fuzz/run.sh — a fuzzing campaign over every harness of tests/fuzz, each for SECONDS (default 60),
# from its committed seed corpus (tests/fuzz/corpus/<name>/, read only; new inputs go to a scratch copy).
#   cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DLLMQ_FUZZ=ON -DLLMQ_CUDA=OFF && cmake --build build-fuzz -j2
#   tests/fuzz/run.sh build-fuzz 600        # ten minutes per harness
# Exit status: 0 when no harness found anything, 1 otherwise (the crashing input is in the work folder).
set -u
build=$(cd "${1:-build-fuzz}" && pwd)
secs=${2:-60}
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/llmq-fuzz-run-XXXXXX)
export LLMQ_DATA=${LLMQ_DATA:-$src/../../../shared/datasets} # fuzz_imatrix loads stories260K from there
fail=0
for exe in "$build"/tests/fuzz/fuzz_*; do
  name=$(basename "$exe")
  mkdir -p "$work/$name"
  cp -r "$src/corpus/$name/." "$work/$name/" 2>/dev/null || true
  echo "== $name: ${secs} s"
  if ! (cd "$work" && "$exe" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 \
        "$work/$name" 2>"$work/$name.log"); then
    echo "FINDING in $name: see $work/$name.log"; fail=1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$work/$name.log" || true
done
echo "work folder: $work"
exit $fail
