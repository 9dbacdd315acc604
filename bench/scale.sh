#!/usr/bin/env bash
# bench/scale.sh — `llmq quantize` at 8B–70B scale on a synthetic checkpoint (tests/tools/synth_ckpt: random
# bf16 weights of a real model's shape, seeded, sharded): peak RSS (GNU time: anonymous and file pages
# together), the peaks of anonymous and of file-backed RSS apart (sampled from /proc/PID/status every
# 0.5 s), wall seconds and seconds per block, the output size, and what `--dry-run` predicted for it.
#
#   bench/scale.sh
# Environment: SHAPE (llama-3-8b; any synth_ckpt shape), LAYERS (the shape's depth; fewer keeps the
#   first N blocks), JOBS ("rtn-q4km gptq-dir": RTN into a Q4_K_M GGUF, and GPTQ 4-bit group 128 into a
#   gptq directory), THREADS (2), NSAMPLES (8), SEQLEN (128), SEED (1), WORK (where the checkpoint is kept,
#   default $LLMQ_CACHE/synth: it is reused by later runs, 16 GB for llama-3-8b), BUILD_DIR, LLMQ_CACHE, LLMQ_DATA.
# The calibration text is WikiText-2 valid through SmolLM2's tokenizer (49,152 tokens, fewer than the shape's
# vocabulary, which llmq accepts): random weights, so the figures measure memory and time, not quality.
# Each job's `--dry-run --json` plan (quant/plan.h) is made just before it (its rates measured under the same
# load): its seconds, peak RSS, peak anonymous RSS and output bytes are printed next to the measured ones.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
SHAPE="${SHAPE:-llama-3-8b}"; JOBS="${JOBS:-rtn-q4km gptq-dir}"; THREADS="${THREADS:-2}"
NSAMPLES="${NSAMPLES:-8}"; SEQLEN="${SEQLEN:-128}"; SEED="${SEED:-1}"; WORK="${WORK:-$CACHE/synth}"
bench_build llmq synth_ckpt
SYNTH="$BUILD_DIR/tests/synth_ckpt"
depth=$("$SYNTH" --shape "$SHAPE" --list | tail -1 | awk '{print $4}')
LAYERS="${LAYERS:-$depth}"
MODEL="$WORK/$SHAPE-L$LAYERS-s$SEED"
mkdir -p "$WORK"
if [[ ! -f "$MODEL/config.json" ]]; then
  BASE="$CACHE/smollm2-f32.gguf"
  bench_smollm2_f32 "$BASE"
  bench_tmpdir TOK
  "$LLMQ" convert --model "$BASE" --to hf --out "$TOK/hf" --quiet
  echo "scale: writing $MODEL ($("$SYNTH" --shape "$SHAPE" --layers "$LAYERS" --list | tail -1))" >&2
  t0=$(date +%s)
  "$SYNTH" --shape "$SHAPE" --layers "$LAYERS" --seed "$SEED" --tokenizer "$TOK/hf" --out "$MODEL" >&2
  echo "scale: generated in $(( $(date +%s) - t0 )) s" >&2
fi
OUT="$WORK/out"
mkdir -p "$OUT"

# run NAME CMD...: the command under GNU time with a /proc sampler; prints "seconds peak_rss_kB anon_MiB file_MiB".
run() {
  local name="$1"; shift
  local log="$OUT/$name.log" samples="$OUT/$name.rss"
  : >"$samples"
  local t0; t0=$(date +%s.%N)
  /usr/bin/time -v "$@" >"$log" 2>&1 &
  local tp=$! pid=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do pid=$(pgrep -P "$tp" | head -1 || true); [[ -n "$pid" ]] && break; sleep 0.1; done
  while kill -0 "$tp" 2>/dev/null; do
    [[ -n "$pid" ]] && awk '/^RssAnon|^RssFile/{printf "%s ", $2} END{print ""}' "/proc/$pid/status" >>"$samples" 2>/dev/null || true
    sleep 0.5
  done
  wait "$tp" || { tail -5 "$log" >&2; echo "scale: $name failed (log $log)" >&2; return 1; }
  local s; s=$(echo "$(date +%s.%N) - $t0" | bc)
  local kb; kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$log")
  echo "$s $kb $(awk 'NF==2 && $1>m{m=$1} END{print m/1024}' "$samples") $(awk 'NF==2 && $2>m{m=$2} END{print m/1024}' "$samples")"
}

# predict NAME CMD...: `CMD --dry-run --json` (the preflight plan, quant/plan.h) just before the job, so that its
# rates are measured under the same machine load; sets P_S (seconds), P_PEAK / P_ANON (MiB), P_OUT (bytes).
predict() {
  local name="$1"; shift
  local js="$OUT/$name.plan.json"
  "$@" --dry-run --json "$js" --force >"$OUT/$name.plan.txt" 2>&1 || { tail -3 "$OUT/$name.plan.txt" >&2; return 1; }
  read -r P_S P_PEAK P_ANON P_OUT < <(python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["preflight"]
print("%.0f %.0f %.0f %d" % (p["seconds"], p["ram_peak_bytes"]/2**20, p["ram_anon_max_bytes"]/2**20, p["output_bytes"]))' "$js")
}

echo "shape $SHAPE, $LAYERS layers, $THREADS threads, calibration ${NSAMPLES} x ${SEQLEN}: $MODEL"
echo "(pred_*: llmq quantize --dry-run's estimates, made just before each job; MB = MiB)"
printf '%-10s %9s %9s %9s %11s %11s %11s %11s %11s %14s %14s\n' job seconds pred_s s/block peak_rss_MB pred_peak_MB \
  anon_MB pred_anon_MB file_MB out_bytes pred_out_bytes
for j in $JOBS; do
  case "$j" in
    rtn-q4km)
      cmd=("$LLMQ" quantize --model "$MODEL" --method rtn --format gguf --gguf-type Q4_K_M --threads "$THREADS"
        --out "$OUT/q4km.gguf") ;;
    gptq-dir)
      cmd=("$LLMQ" quantize --model "$MODEL" --method gptq --bits 4 --group-size 128 --format gptq
        --calib wikitext-2-valid --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --threads "$THREADS" --out "$OUT/gptq") ;;
    *) echo "scale: unknown job $j (rtn-q4km, gptq-dir)" >&2; exit 2 ;;
  esac
  predict "$j" "${cmd[@]}"
  res=$(run "$j" "${cmd[@]}" --force)
  read -r s kb anon file <<<"$res"
  out="$OUT/q4km.gguf"; [[ "$j" == gptq-dir ]] && out="$OUT/gptq"
  printf '%-10s %9.0f %9s %9.1f %11.0f %11s %11.0f %11s %11.0f %14d %14s\n' "$j" "$s" "$P_S" "$(echo "$s / $LAYERS" | bc -l)" \
    "$(echo "$kb / 1024" | bc -l)" "$P_PEAK" "$anon" "$P_ANON" "$file" "$(du -sb "$out" | cut -f1)" "$P_OUT"
  rm -rf "$OUT/q4km.gguf" "$OUT/gptq"
done
