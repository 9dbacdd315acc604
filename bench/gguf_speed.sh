#!/usr/bin/env bash
# bench/gguf_speed.sh — wall time of `llmq quantize --format gguf --method rtn` next to llama.cpp's own
# quantizer (llama_model_quantize of llama-cpp-python 0.3.36, the function llama-quantize calls) on the
# same f32 input with the same thread count, for Q8_0, Q4_0, Q4_K_M (override with TYPES).
#
#   bench/gguf_speed.sh [REPS (3)]
# Input: $MODEL (default ~/.cache/llmq/smollm2-f32.gguf, made by `llmq convert` when missing).
# THREADS (default nproc), TYPES ("Q8_0 Q4_0 Q4_K_M"), BUILD_DIR (default <repo>/build), LLMQ_CACHE.
# Prints, per type, the median seconds of each, the ratio llama.cpp / llmq (>1: llmq faster), and whether
# the two files are byte-identical (llmq runs with --no-provenance so they can be).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PY="${PYTHON:-$CACHE/venv/bin/python}" # PYTHON, as bench/llama_tools.sh reads it (not LLMQ_PYTHON)
REPS="${1:-3}"
THREADS="${THREADS:-$(nproc)}"
TYPES="${TYPES:-Q8_0 Q4_0 Q4_K_M}"
MODEL="${MODEL:-$CACHE/smollm2-f32.gguf}"
bench_need_llmq
bench_smollm2_f32 "$MODEL"
bench_tmpdir WORK /tmp/llmq_gguf_speed.XXXXXX
echo "input $MODEL ($(du -m "$MODEL" | cut -f1) MB), threads $THREADS, median of $REPS" >&2

printf '%-8s %10s %12s %8s %10s\n' type "llmq s" "llama.cpp s" ratio identical
for t in $TYPES; do
  : >"$WORK/l.txt"; : >"$WORK/c.txt"
  for ((i = 0; i < REPS; i++)); do
    t0=$(date +%s.%N)
    "$LLMQ" quantize --model "$MODEL" --format gguf --gguf-type "$t" --method rtn --no-provenance \
      --threads "$THREADS" --force --out "$WORK/llmq.gguf" >/dev/null 2>"$WORK/llmq.err" \
      || { cat "$WORK/llmq.err" >&2; exit 1; }
    echo "$(date +%s.%N) - $t0" | bc >>"$WORK/l.txt"
    "$PY" - "$MODEL" "$WORK/lcpp.gguf" "$t" "$THREADS" >>"$WORK/c.txt" <<'PYEOF'
import sys, time, ctypes, os
import llama_cpp
src, dst, tname, nth = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + tname)
p.nthread = nth
devnull = os.open(os.devnull, os.O_WRONLY); saved = os.dup(2); os.dup2(devnull, 2)
t0 = time.perf_counter()
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
dt = time.perf_counter() - t0
os.dup2(saved, 2)
if rc != 0:
    sys.exit(f"llama_model_quantize failed: {rc}")
print(f"{dt:.4f}")
PYEOF
  done
  lm=$(median <"$WORK/l.txt"); cm=$(median <"$WORK/c.txt")
  same=no; cmp -s "$WORK/llmq.gguf" "$WORK/lcpp.gguf" && same=yes
  printf '%-8s %10.3f %12.3f %7.2fx %10s\n' "$t" "$lm" "$cm" "$(echo "$cm / $lm" | bc -l)" "$same"
done
