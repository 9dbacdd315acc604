#!/usr/bin/env bash
# tests/gpu/scale_gpu.sh — issue 17's 8B-shaped timings on the GPU machine, called by tests/gpu/run.sh (SKIP_8B=1
# skips it): a synthetic llama-3-8b checkpoint (tests/tools/synth_ckpt: random bf16 weights of the real shape, D 4096,
# F 14336, 32 layers, 32 / 8 heads; written on the machine itself, 16 GB, since at most 64 MiB can be sent to it) with
# SmolLM2's tokenizer (from the bundle's SmolLM2 cut), then `llmq quantize --device cuda` with 128 x 2048 calibration
# tokens (wiki.test + wiki.valid through that tokenizer):
#   gptq-w4g128   --method gptq --bits 4 --group-size 128 --format gptq, all 32 layers (target: <= 60 s);
#   awq-w4g128    --method awq  --bits 4 --group-size 128 --format awq,  the first AWQ_LAYERS layers (4);
#   gptq-q4km     --method gptq --format gguf --gguf-type Q4_K_M,        the first Q4KM_LAYERS layers (4);
# (AWQ_LAYERS / Q4KM_LAYERS: synth_ckpt --layers, the first blocks, the embedding and head of the full shape.)
# awq and gptq into Q4_K_M run on fewer layers because their searches / solves are CPU-bound today (quant/qblocks.h:
# AWQ's search is calib/model/forward.c's, GPTQ onto ggml blocks runs on the CPU): their per-block time times 32 is
# an EXTRAPOLATION, printed as such. Each job: wall seconds (timeout JOB_TIMEOUT, 240), peak host RSS (/proc, every
# 0.5 s), peak device memory in use (nvidia-smi, every 0.5 s, minus what was in use before), the seconds the solvers
# report (the sum of the --json rows' "seconds") and what is left for load, calibration passes and write, and the
# "decoder blocks" line. Random weights: time and memory only (perplexity is meaningless).
# Needs: $BIN (llmq, synth_ckpt), $LLMQ_DATA (wikitext-2-raw, smollm2-4blk.Q4_1.gguf in $LLMQ_DATA/..), $OUT.
set -uo pipefail
W="${SCALE_WORK:-/tmp/llmq-scale}"
AWQ_LAYERS="${AWQ_LAYERS:-4}"; Q4KM_LAYERS="${Q4KM_LAYERS:-4}"; JOB_TIMEOUT="${JOB_TIMEOUT:-240}"
SMOL="${LLMQ_EVAL_GPU_MODEL:-}"
T="$LLMQ_DATA/wikitext-2-raw"
rm -rf "$W" && mkdir -p "$W"
if [[ -z "$SMOL" || ! -x "$BIN/synth_ckpt" ]]; then echo "scale: skipped (needs the SmolLM2 cut and synth_ckpt)"; exit 0; fi
"$BIN/llmq" convert --model "$SMOL" --to hf --out "$W/tok" --quiet || exit 1
t0=$(date +%s)
"$BIN/synth_ckpt" --shape llama-3-8b --out "$W/m" --tokenizer "$W/tok" >"$OUT/scale_synth.log" 2>&1 || { tail "$OUT/scale_synth.log"; exit 1; }
echo "scale: llama-3-8b synthetic checkpoint written in $(( $(date +%s) - t0 )) s ($(du -sh "$W/m" | cut -f1))"
dev0=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1); dev0=${dev0:-0}

# job NAME LAYERS ARGS...: one quantize run on the first LAYERS blocks (a symlinked copy with a cut config).
job() {
  local name="$1" layers="$2"; shift 2
  local model="$W/m"
  if [[ "$layers" != 32 ]]; then
    model="$W/m$layers"
    [[ -d "$model" ]] || "$BIN/synth_ckpt" --shape llama-3-8b --layers "$layers" --out "$model" --tokenizer "$W/tok" \
      >>"$OUT/scale_synth.log" 2>&1 || { echo "scale: $name: synth_ckpt --layers $layers failed"; return; }
  fi
  local log="$OUT/scale_$name.log" mem="$OUT/scale_$name.mem"
  : >"$mem"
  local s0; s0=$(date +%s%N)
  timeout "$JOB_TIMEOUT" "$BIN/llmq" quantize --model "$model" "$@" --calib "$T/wiki.test.raw" --calib "$T/wiki.valid.raw" \
    --nsamples 128 --seqlen 2048 --seed 1 --device cuda --no-checkpoint --json "$W/$name.json" --out "$W/out-$name" \
    >"$log" 2>&1 &
  local tp=$!
  while kill -0 "$tp" 2>/dev/null; do
    local pid; pid=$(pgrep -P "$tp" | head -1 || true)
    local rss=0; [[ -n "$pid" ]] && rss=$(awk '/^VmRSS/{print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    echo "${rss:-0} $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)" >>"$mem"
    sleep 0.5
  done
  wait "$tp"; local rc=$?
  local s; s=$(awk -v a="$(date +%s%N)" -v b="$s0" 'BEGIN{printf "%.1f", (a - b) / 1e9}')
  local rss_gb dev_gb
  rss_gb=$(awk '$1>m{m=$1} END{printf "%.1f", m/1048576}' "$mem")
  dev_gb=$(awk -v b="$dev0" '$2>m{m=$2} END{printf "%.1f", (m-b)/1024}' "$mem")
  local solve="?"
  [[ -f "$W/$name.json" ]] && command -v python3 >/dev/null && solve=$(python3 -c "import json,sys; print('%.1f' % sum(r.get('seconds', 0) for r in json.load(open(sys.argv[1]))['layers']))" "$W/$name.json" 2>/dev/null || echo "?")
  local st="done"; [[ $rc == 124 ]] && st="TIMED OUT at $JOB_TIMEOUT s"; [[ $rc != 0 && $rc != 124 ]] && st="FAILED (rc $rc)"
  local per=""; [[ "$layers" != 32 ]] && per=" (extrapolated to 32 layers: $(awk -v s="$s" -v l="$layers" 'BEGIN{printf "%.0f", s * 32 / l}') s, an estimate)"
  echo "scale: $name, $layers layers: $st in $s s$per; solvers ${solve} s; peak host RSS ${rss_gb} GiB, peak device memory ${dev_gb} GiB"
  grep -m1 "decoder blocks" "$log" | sed "s/^/scale: $name: /"
  [[ $rc == 0 ]] || tail -5 "$log"
  rm -rf "$W/out-$name"
}
job gptq-w4g128 32 --method gptq --bits 4 --group-size 128 --format gptq
job awq-w4g128 "$AWQ_LAYERS" --method awq --bits 4 --group-size 128 --format awq
job gptq-q4km "$Q4KM_LAYERS" --method gptq --format gguf --gguf-type Q4_K_M
rm -rf "$W"
