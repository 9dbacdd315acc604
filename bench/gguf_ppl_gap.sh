#!/usr/bin/env bash
# bench/gguf_ppl_gap.sh — every GGUF type / mix llmq writes, loaded and evaluated by llama.cpp itself:
# perplexity from llama.cpp's llama-perplexity next to `llmq eval` on the same file (issue 5: within 0.5%).
#
#   bench/gguf_ppl_gap.sh
# Input: ~/.cache/llmq/smollm2-f32.gguf, `llmq quantize --format gguf --method rtn --gguf-type T`.
# Evaluation: wiki.test.raw, llamacpp protocol ctx 512, CHUNKS chunks (default 20; -1 = all) in both.
# llama.cpp multiplies quantized weights with 8-bit (Q8_0 / Q8_K) activations; llmq eval decodes weights
# to f32 and multiplies in f32, so a small gap is expected; the column "gap" is (llama.cpp - llmq) / llmq.
# EMULATE=1 adds `llmq eval --emulate llamacpp-cpu` (calib/model/actq.h: activations rounded as llama.cpp's CPU
# backend does, flash attention on as llama-perplexity's default) and its gap as two more columns.
# Environment: TYPES (default: every supported mix), CHUNKS, THREADS, EMULATE, BUILD_DIR, LLMQ_CACHE, LLMQ_DATA.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CHUNKS="${CHUNKS:-20}"
THREADS="${THREADS:-$(nproc)}"
EMULATE="${EMULATE:-0}"
TYPES="${TYPES:-F16 BF16 Q8_0 Q6_K Q5_K_M Q5_K_S Q5_0 Q5_1 Q4_K_M Q4_K_S Q4_0 Q4_1 Q3_K_L Q3_K_M Q3_K_S Q2_K IQ4_NL IQ4_XS}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
TEST="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
TOOLS="$("$SRC/bench/llama_tools.sh")"
bench_tmpdir WORK /tmp/llmq_gguf_gap.XXXXXX
lcpp_chunks=(); [[ "$CHUNKS" != -1 ]] && lcpp_chunks=(--chunks "$CHUNKS")
echo "base $BASE; wiki.test llamacpp ctx 512, chunks $CHUNKS; threads $THREADS" >&2
if [[ "$EMULATE" == 1 ]]; then
  printf '%-8s %9s %12s %12s %9s %12s %9s\n' type MiB "llama.cpp" llmq gap "llmq-emul" "gap-emul"
else
  printf '%-8s %9s %12s %12s %9s\n' type MiB "llama.cpp" llmq gap
fi
for t in $TYPES; do
  q="$WORK/$t.gguf"
  "$LLMQ" quantize --model "$BASE" --format gguf --gguf-type "$t" --method rtn --threads "$THREADS" \
    --out "$q" >"$WORK/q.log" 2>&1 || { echo "$t: llmq quantize failed:" >&2; tail -3 "$WORK/q.log" >&2; continue; }
  "$TOOLS/llama-perplexity" -m "$q" -f "$TEST" -c 512 -b 512 "${lcpp_chunks[@]}" -t "$THREADS" \
    >"$WORK/l.txt" 2>&1 || { echo "$t: llama-perplexity failed to load or run it:" >&2; tail -3 "$WORK/l.txt" >&2; continue; }
  lp=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$WORK/l.txt")
  "$LLMQ" eval --model "$q" --ppl "$TEST" --chunks "$CHUNKS" --threads "$THREADS" >"$WORK/m.txt" 2>/dev/null
  mp=$(bench_final_ppl "$WORK/m.txt")
  row=$(printf '%-8s %9.2f %12.4f %12.4f %8.3f%%' "$t" "$(echo "$(stat -c %s "$q") / 1048576" | bc -l)" "$lp" "$mp" \
    "$(echo "100 * ($lp - $mp) / $mp" | bc -l)")
  if [[ "$EMULATE" == 1 ]]; then
    "$LLMQ" eval --model "$q" --ppl "$TEST" --chunks "$CHUNKS" --threads "$THREADS" --emulate llamacpp-cpu \
      >"$WORK/e.txt" 2>/dev/null
    ep=$(bench_final_ppl "$WORK/e.txt")
    row+=$(printf ' %12.4f %8.3f%%' "$ep" "$(echo "100 * ($lp - $ep) / $ep" | bc -l)")
  fi
  echo "$row"
  rm -f "$q"
done
