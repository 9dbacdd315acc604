#!/usr/bin/env bash
# bench/gptq_speed.sh — GPTQ on one 4096x4096 and one 4096x11008 layer W (R = 4096 out, C in) with a
# fixed seeded correlated H (C, C): llmq (bench_gptq_speed) next to the numpy port of the reference
# fasterquant (tests/py/gptq_ref.py, float32, numpy's own OpenBLAS), same inputs, same threads, one run.
#
#   bench/gptq_speed.sh [SHAPES ("4096x4096 4096x11008")]
# Environment: BUILD_DIR (default <repo>/build), LLMQ_PYTHON (default ~/.cache/llmq/venv/bin/python),
#              THREADS (default nproc; exported as OPENBLAS_NUM_THREADS / OMP_NUM_THREADS to both),
#              GROUP (default 128).
# Prints per shape: llmq seconds, numpy seconds, the ratio numpy / llmq, and the fraction of integer
# codes on which the two agree (they differ only through float32 rounding of Cholesky / GEMM).
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SRC/build}"
PY="${LLMQ_PYTHON:-$HOME/.cache/llmq/venv/bin/python}"
SHAPES="${1:-4096x4096 4096x11008}"
THREADS="${THREADS:-$(nproc)}"
GROUP="${GROUP:-128}"
export OPENBLAS_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$SRC" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" --target bench_gptq_speed -j"$(nproc)" >/dev/null

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
printf "%-12s %8s %10s %10s %8s %10s\n" shape threads llmq_s numpy_s ratio codes_eq
for shape in $SHAPES; do
  R="${shape%x*}"; C="${shape#*x}"
  echo "llmq:  bench_gptq_speed --R $R --C $C --group $GROUP ..." >&2
  L="$("$BUILD_DIR/bench/bench_gptq_speed" --R "$R" --C "$C" --group "$GROUP" --dump "$WORK/p")"
  echo "numpy: gptq_ref.py --bench $R $C ..." >&2
  N="$("$PY" "$SRC/tests/py/gptq_ref.py" --bench "$R" "$C" --in "$WORK/p" --group "$GROUP" --save)"
  "$PY" - "$WORK/p" "$shape" "$THREADS" "$L" "$N" <<'PYEOF'
import json, sys
import numpy as np
p, shape, threads, l, n = sys.argv[1:]
l, n = json.loads(l), json.loads(n)
eq = (np.fromfile(p + ".llmq.q", np.uint8) == np.fromfile(p + ".ref.q", np.uint8)).mean()
print(f"{shape:<12} {threads:>8} {l['seconds']:>10.2f} {n['seconds']:>10.2f} {n['seconds'] / l['seconds']:>7.2f}x {eq:>10.6f}")
PYEOF
  rm -f "$WORK"/p.*
done
