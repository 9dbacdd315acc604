#!/usr/bin/env bash
# tests/gpu/scale_gpu.sh — issue 17's 8B-shaped timings on the GPU machine, called by tests/gpu/run.sh (SKIP_8B=1
# skips it): a synthetic llama-3-8b checkpoint (tests/tools/synth_ckpt: random bf16 weights of the real shape, D 4096,
# F 14336, 32 layers, 32 / 8 heads; written on the machine itself, 16 GB, since at most 64 MiB can be sent to it) with
# SmolLM2's tokenizer (from the bundle's SmolLM2 cut), then `llmq quantize --device cuda` with 128 x 2048 calibration
# tokens (wiki.test + wiki.valid through that tokenizer):
#   gptq-w4g128   --method gptq --bits 4 --group-size 128 --format gptq, all 32 layers (target: <= 60 s), with the
#                 block's linears on TF32 tensor cores (LLMQ_BLOCK_MATH=tf32, calib/model/devblock.h) and in FP32;
#   awq-w4g128    --method awq  --bits 4 --group-size 128 --format awq,  the first AWQ_LAYERS layers (4);
#   gptq-q4km     --method gptq --format gguf --gguf-type Q4_K_M,        the first Q4KM_LAYERS layers (4), TF32;
# (AWQ_LAYERS / Q4KM_LAYERS: synth_ckpt --layers, the first blocks, the embedding and head of the full shape.)
# awq and gptq into Q4_K_M run on fewer layers because parts of them are CPU-bound today (AWQ's clip search runs on the
# host from sampled rows, its scale search on the block path; GPTQ onto ggml blocks runs on the CPU): per-block time x 32 is
# an EXTRAPOLATION, printed as such. Each job: wall seconds (timeout JOB_TIMEOUT, 150), peak host RSS (/proc, every
# 0.5 s), peak device memory in use (nvidia-smi, every 0.5 s, minus what was in use before), the "decoder blocks"
# line and quantize's time by stage (quant/quantize.h "Profile": which stage dominates). Random weights: time and
# memory only (perplexity is meaningless).
# Needs: $BIN (llmq, synth_ckpt), $LLMQ_DATA (wikitext-2-raw), $LLMQ_EVAL_GPU_MODEL (the SmolLM2 cut), $OUT.
set -uo pipefail
W="${SCALE_WORK:-/tmp/llmq-scale}"
AWQ_LAYERS="${AWQ_LAYERS:-4}"; Q4KM_LAYERS="${Q4KM_LAYERS:-4}"; JOB_TIMEOUT="${JOB_TIMEOUT:-150}"
# the script's own smoke test off the GPU machine: SHAPE=small VOCAB=49152 LAYERS=2 AWQ_LAYERS=1 Q4KM_LAYERS=1
# DEVICE=cpu NSAMPLES=4 SEQLEN=64 MATHS=fp32 (VOCAB: synth_ckpt --vocab, at least the tokenizer's 49,152)
SHAPE="${SHAPE:-llama-3-8b}"; LAYERS="${LAYERS:-32}"; DEVICE="${DEVICE:-cuda}"
NSAMPLES="${NSAMPLES:-128}"; SEQLEN="${SEQLEN:-2048}"; MATHS="${MATHS:-tf32 fp32}"; VOCAB="${VOCAB:-}"
SMOL="${LLMQ_EVAL_GPU_MODEL:-}"
T="$LLMQ_DATA/wikitext-2-raw"
rm -rf "$W" && mkdir -p "$W"
if [[ -z "$SMOL" || ! -x "$BIN/synth_ckpt" ]]; then
  echo "scale: skipped (needs the SmolLM2 cut and synth_ckpt)"
  exit 0
fi
"$BIN/llmq" convert --model "$SMOL" --to hf --out "$W/tok" --quiet >/dev/null || exit 1

# synth N: the shape's first N blocks in $W/mN, written once.
synth() {
  [[ -f "$W/m$1/config.json" ]] && return 0
  local t0; t0=$(date +%s)
  "$BIN/synth_ckpt" --shape "$SHAPE" --layers "$1" ${VOCAB:+--vocab "$VOCAB"} --out "$W/m$1" --tokenizer "$W/tok" \
    >>"$OUT/scale_synth.log" 2>&1 || { tail -3 "$OUT/scale_synth.log"; return 1; }
  echo "scale: $SHAPE, $1 layers, written in $(( $(date +%s) - t0 )) s ($(du -sh "$W/m$1" | cut -f1))"
}
gpu_mem() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
dev0=$(gpu_mem); dev0=${dev0:-0}

# job NAME LAYERS MATH ARGS...: one quantize run on the first LAYERS blocks, LLMQ_BLOCK_MATH=MATH; host RSS and device
# memory sampled every 0.5 s; prints the wall time, the peaks, the decoder-blocks line and the time by stage.
job() {
  local name="$1" layers="$2" math="$3"; shift 3
  synth "$layers" || { echo "scale: $name: synth_ckpt --layers $layers failed"; return; }
  local log="$OUT/scale_$name.log" mem="$OUT/scale_$name.mem"
  : >"$mem"
  local s0; s0=$(date +%s%N)
  LLMQ_BLOCK_MATH="$math" timeout "$JOB_TIMEOUT" "$BIN/llmq" quantize --model "$W/m$layers" "$@" \
    --calib "$T/wiki.test.raw" --calib "$T/wiki.valid.raw" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 1 --device "$DEVICE" \
    --no-checkpoint --json "$W/$name.json" --out "$W/out-$name" >"$log" 2>&1 &
  local tp=$!
  while kill -0 "$tp" 2>/dev/null; do
    local pid rss=0; pid=$(pgrep -P "$tp" | head -1 || true)
    [[ -n "$pid" ]] && rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    echo "${rss:-0} $(gpu_mem)" >>"$mem"
    sleep 0.5
  done
  wait "$tp"; local rc=$?
  local s rss_gb dev_gb st="done" per=""
  s=$(awk -v a="$(date +%s%N)" -v b="$s0" 'BEGIN{printf "%.1f", (a - b) / 1e9}')
  rss_gb=$(awk '$1>m{m=$1} END{printf "%.1f", m/1048576}' "$mem")
  dev_gb=$(awk -v b="$dev0" '$2>m{m=$2} END{printf "%.1f", (m-b)/1024}' "$mem")
  [[ $rc == 124 ]] && st="TIMED OUT at $JOB_TIMEOUT s"
  [[ $rc != 0 && $rc != 124 ]] && st="FAILED (rc $rc)"
  [[ "$layers" != "$LAYERS" ]] && per=" (x $LAYERS / $layers: \
$(awk -v s="$s" -v l="$layers" -v L="$LAYERS" 'BEGIN{printf "%.0f", s * L / l}') s, an extrapolation)"
  echo "scale: $name, $layers layers, $math: $st in $s s$per; peak host RSS $rss_gb GiB, peak device memory $dev_gb GiB"
  grep -m1 "decoder blocks" "$log" | sed "s/^/scale: $name: /"
  grep -m1 "time by stage" "$log" | sed "s/^/scale: $name: /"
  [[ $rc == 0 ]] || tail -5 "$log"
  rm -rf "$W/out-$name"
}
for m in $MATHS; do job "gptq-w4g128-$m" "$LAYERS" "$m" --method gptq --bits 4 --group-size 128 --format gptq; done
job awq-w4g128 "$AWQ_LAYERS" fp32 --method awq --bits 4 --group-size 128 --format awq
job gptq-q4km "$Q4KM_LAYERS" "${MATHS%% *}" --method gptq --format gguf --gguf-type Q4_K_M
rm -rf "$W"
