#!/usr/bin/env bash
# bench/gptq_speed.sh — GPTQ on one 4096x4096 and one 4096x11008 layer W (R = 4096 out, C in) with a
# fixed seeded correlated H (C, C): llmq (bench_gptq_speed) next to the numpy port of the reference
# fasterquant (tests/py/gptq_ref.py, float32, numpy's own OpenBLAS), same inputs, same threads, one run;
# plus llmq with steps 5-7 on CUDA (bench_gptq_speed --device cuda) when a device is usable.
#
#   bench/gptq_speed.sh [SHAPES ("4096x4096 4096x11008")]
# Environment: BUILD_DIR (default <repo>/build), LLMQ_PYTHON (default ~/.cache/llmq/venv/bin/python),
#              THREADS (default nproc; exported as OPENBLAS_NUM_THREADS / OMP_NUM_THREADS to both),
#              GROUP (default 128), DEVICE (auto | cpu | cuda; default auto = the CUDA column when
#              bench_gptq_speed --device cuda works in BUILD_DIR, i.e. a CUDA build and a device;
#              cuda = required, the script fails without one).
# Prints per shape: llmq CPU seconds, llmq CUDA seconds ("-" without), numpy seconds, the ratios numpy /
# llmq-cpu and llmq-cpu / llmq-cuda, and the fraction of integer codes on which llmq-cpu and llmq-cuda
# agree with numpy (they differ only through float32 rounding of Cholesky / GEMM).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
SHAPES="${1:-4096x4096 4096x11008}"
THREADS="${THREADS:-$(nproc)}"
GROUP="${GROUP:-128}"
DEVICE="${DEVICE:-auto}"
export OPENBLAS_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

bench_build bench_gptq_speed
bench_tmpdir WORK
BENCH="$BUILD_DIR/bench/bench_gptq_speed"
CUDA=0
case "$DEVICE" in
  cpu) ;;
  cuda) CUDA=1 ;;
  auto) if "$BENCH" --device cuda --R 8 --C 64 >/dev/null 2>&1; then CUDA=1; fi ;;
  *) echo "gptq_speed.sh: DEVICE must be auto, cpu or cuda (got $DEVICE)" >&2; exit 1 ;;
esac
printf "%-12s %8s %10s %10s %10s %9s %9s %10s %10s\n" shape threads cpu_s cuda_s numpy_s np/cpu cpu/cuda eq_cpu eq_cuda
for shape in $SHAPES; do
  R="${shape%x*}"; C="${shape#*x}"
  echo "llmq:  bench_gptq_speed --R $R --C $C --group $GROUP ..." >&2
  L="$("$BENCH" --R "$R" --C "$C" --group "$GROUP" --dump "$WORK/p")"
  K="null"
  if [[ $CUDA == 1 ]]; then
    echo "llmq:  bench_gptq_speed --R $R --C $C --group $GROUP --device cuda ..." >&2
    K="$("$BENCH" --R "$R" --C "$C" --group "$GROUP" --device cuda --dump "$WORK/c")"
  fi
  echo "numpy: gptq_ref.py --bench $R $C ..." >&2
  N="$("$PY" "$SRC/tests/py/gptq_ref.py" --bench "$R" "$C" --in "$WORK/p" --group "$GROUP" --save)"
  "$PY" - "$WORK" "$shape" "$THREADS" "$L" "$K" "$N" <<'PYEOF'
import json, sys
import numpy as np
w, shape, threads, l, k, n = sys.argv[1:]
l, k, n = json.loads(l), json.loads(k), json.loads(n)
ref = np.fromfile(w + "/p.ref.q", np.uint8)
eq = (np.fromfile(w + "/p.llmq.q", np.uint8) == ref).mean()
cs, ratio, eqc = "-", "-", "-"
if k is not None:
    cs, ratio = f"{k['seconds']:.2f}", f"{l['seconds'] / k['seconds']:.2f}x"
    eqc = f"{(np.fromfile(w + '/c.llmq.q', np.uint8) == ref).mean():.6f}"
print(f"{shape:<12} {threads:>8} {l['seconds']:>10.2f} {cs:>10} {n['seconds']:>10.2f} "
      f"{n['seconds'] / l['seconds']:>8.2f}x {ratio:>9} {eq:>10.6f} {eqc:>10}")
PYEOF
  rm -f "$WORK"/p.* "$WORK"/c.*
done
