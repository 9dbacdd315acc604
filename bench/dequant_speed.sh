#!/usr/bin/env bash
# bench/dequant_speed.sh — f32 decoding throughput of llmq (fast + reference decoders) next to
# gguf-py's numpy gguf.quants.dequantize, one thread, on the very same input bytes, in one run.
#
#   bench/dequant_speed.sh [MB (64)] [REPS (7)]
# Environment: BUILD_DIR (default <repo>/build), LLMQ_PYTHON (default ~/.cache/llmq/venv/bin/python),
#              TYPES (comma list, default all decodable types).
# Prints one table on stdout: per type the median GB/s of f32 output for llmq fast, llmq reference
# and numpy, and the ratio llmq fast / numpy. numpy is pinned to one thread as well.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
MB="${1:-64}"
REPS="${2:-7}"

bench_build bench_dequant_speed
bench_tmpdir WORK
TYPE_ARGS=()
if [[ -n "${TYPES:-}" ]]; then TYPE_ARGS=(--types "$TYPES"); fi
echo "llmq: bench_dequant_speed --mb $MB --reps $REPS ..." >&2
"$BUILD_DIR/bench/bench_dequant_speed" --mb "$MB" --reps "$REPS" --dump "$WORK" "${TYPE_ARGS[@]}" >"$WORK/llmq.tsv"

echo "numpy: gguf.quants.dequantize on the same inputs ..." >&2
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
"$PY" - "$WORK" "$REPS" <<'EOF'
import sys, time, pathlib
import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

work, reps = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rows = [l.split("\t") for l in (work / "llmq.tsv").read_text().strip().split("\n")]
head, rows = rows[0], rows[1:]
col = {k: i for i, k in enumerate(head)}
print(f"{'type':8} {'in_MB':>7} {'out_MB':>7} {'llmq_GB/s':>10} {'llmq_ref_GB/s':>14} {'numpy_GB/s':>11} {'llmq/numpy':>11}")
for r in rows:
    name = r[col["type"]]
    raw = np.fromfile(work / f"{name}.bin", dtype=np.uint8)
    if name == "f64":  # gguf-py has no F64 decoder: time numpy's own cast
        f = lambda: raw.view(np.float64).astype(np.float32)
    else:
        qt = T[name.upper()]
        f = lambda: gguf.quants.dequantize(raw, qt)
        if name == "f32":  # dequantize() is a zero-copy view for F32: time a real copy instead
            f = lambda: np.array(raw.view(np.float32), copy=True)
    out = f()  # warm-up
    out_bytes = out.size * 4
    ts = []
    for _ in range(max(1, min(reps, 5))):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    t = sorted(ts)[len(ts) // 2]
    np_gbps = out_bytes / t / 1e9
    fast = float(r[col["fast_GBps"]])
    print(f"{name:8} {r[col['in_MB']]:>7} {r[col['out_MB']]:>7} {fast:10.2f} {float(r[col['ref_GBps']]):14.2f} "
          f"{np_gbps:11.3f} {fast / np_gbps:10.1f}x", flush=True)
EOF
