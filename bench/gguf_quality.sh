#!/usr/bin/env bash
# bench/gguf_quality.sh — GGUF quality at the same file size: llama.cpp with its own importance matrix
# versus llmq's imatrix, GPTQ and AWQ(+GPTQ) paths, for Q4_K_M, Q3_K_M, Q2_K and Q4_0 (issue 5).
#
#   bench/gguf_quality.sh [--quick]
# Base: ~/.cache/llmq/smollm2-f32.gguf. Calibration text: wiki.valid.raw for everyone:
#   llama.cpp   llama-imatrix (built by bench/llama_tools.sh) over the first NSAMPLES chunks of SEQLEN
#               tokens, then llama-quantize --imatrix (the row "lcpp-imat"; "lcpp" = no imatrix)
#   llmq        NSAMPLES random windows of SEQLEN tokens (seed 0): `llmq calib` → --imatrix (llmq-imat),
#               --method gptq, awq, awq+gptq (each gathers its own statistics from the same text)
# Evaluation: wiki.test.raw, llamacpp protocol ctx 512, CHUNKS chunks, all by `llmq eval` (f32 arithmetic,
#   the same code for every file): PPL and mean KLD against the base's logits.
# Full: NSAMPLES=128 SEQLEN=512 CHUNKS=-1 (hours on 2 cores). Default: CHUNKS=40. --quick: NSAMPLES=16
#   SEQLEN=512 CHUNKS=10 TYPES="Q4_K_M Q4_0".
# Environment: TYPES, VARIANTS ("lcpp lcpp-imat llmq-imat llmq-gptq llmq-awq llmq-awq+gptq"; a -ao suffix,
#   e.g. llmq-gptq-ao, llmq-awq+gptq-ao, adds --act-order), THREADS,
#   BUILD_DIR, LLMQ_CACHE, LLMQ_DATA, WORK (resumable like bench/quality.sh: finished rows are kept).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
if [[ "${1:-}" == "--quick" ]]; then
  NSAMPLES="${NSAMPLES:-16}"; SEQLEN="${SEQLEN:-512}"; CHUNKS="${CHUNKS:-10}"; TYPES="${TYPES:-Q4_K_M Q4_0}"
else
  NSAMPLES="${NSAMPLES:-128}"; SEQLEN="${SEQLEN:-512}"; CHUNKS="${CHUNKS:-40}"
fi
TYPES="${TYPES:-Q4_K_M Q3_K_M Q2_K Q4_0}"
VARIANTS="${VARIANTS:-lcpp lcpp-imat llmq-imat llmq-gptq llmq-awq llmq-awq+gptq}"
THREADS="${THREADS:-$(nproc)}"
PY="${PYTHON:-$CACHE/venv/bin/python}" # PYTHON, as bench/llama_tools.sh reads it (not LLMQ_PYTHON)
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
VALID="$LLMQ_DATA/wikitext-2-raw/wiki.valid.raw"
TEST="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
WORK="${WORK:-$(mktemp -d /tmp/llmq_gguf_quality.XXXXXX)}"
mkdir -p "$WORK"
TOOLS="$("$SRC/bench/llama_tools.sh")"
echo "base $BASE; calib wiki.valid ${NSAMPLES}x${SEQLEN}; eval wiki.test llamacpp ctx 512 chunks $CHUNKS; threads $THREADS; work $WORK" >&2
CAL=(--calib "$VALID" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 0)

# base logits once (KLD reference)
if [[ ! -f "$WORK/base.done" ]]; then
  "$LLMQ" eval --model "$BASE" --ppl "$TEST" --chunks "$CHUNKS" --threads "$THREADS" \
    --save-logits "$WORK/base.logits" --json "$WORK/base.json" >"$WORK/base.txt" 2>"$WORK/base.err"
  touch "$WORK/base.done"
fi
# importance matrices once
if [[ ! -f "$WORK/imat_lcpp.dat" ]]; then
  "$TOOLS/llama-imatrix" -m "$BASE" -f "$VALID" -o "$WORK/imat_lcpp.dat" --output-format dat --chunks "$NSAMPLES" -c "$SEQLEN" \
    -t "$THREADS" >"$WORK/imat_lcpp.log" 2>&1
fi
if [[ ! -f "$WORK/imat_llmq.lcs" ]]; then
  "$LLMQ" calib --model "$BASE" "${CAL[@]}" --no-xtx --threads "$THREADS" --out "$WORK/imat_llmq.lcs" \
    >"$WORK/imat_llmq.log" 2>&1
fi

jget() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }
for t in $TYPES; do
  for v in $VARIANTS; do
    key="${t}_${v}"; out="$WORK/$key.gguf"
    if [[ -f "$WORK/$key.json" ]]; then continue; fi
    t0=$(date +%s.%N)
    case $v in
      lcpp)      "$TOOLS/llama-quantize" "$BASE" "$out" "$t" "$THREADS" >"$WORK/$key.log" 2>&1 ;;
      lcpp-imat) "$TOOLS/llama-quantize" --imatrix "$WORK/imat_lcpp.dat" "$BASE" "$out" "$t" "$THREADS" >"$WORK/$key.log" 2>&1 ;;
      llmq-imat) "$LLMQ" quantize --model "$BASE" --format gguf --gguf-type "$t" --method rtn \
                   --imatrix "$WORK/imat_llmq.lcs" --threads "$THREADS" --force --out "$out" >"$WORK/$key.log" 2>&1 ;;
      llmq-*-ao) "$LLMQ" quantize --model "$BASE" --format gguf --gguf-type "$t" --method "$(m="${v#llmq-}"; echo "${m%-ao}")" \
                   --act-order "${CAL[@]}" --threads "$THREADS" --force --out "$out" >"$WORK/$key.log" 2>&1 ;;
      llmq-*)    "$LLMQ" quantize --model "$BASE" --format gguf --gguf-type "$t" --method "${v#llmq-}" \
                   "${CAL[@]}" --threads "$THREADS" --force --out "$out" >"$WORK/$key.log" 2>&1 ;;
    esac
    secs=$(printf "%.3f" "$(echo "$(date +%s.%N) - $t0" | bc)") # "%.3f": bc prints ".49", which is not JSON
    "$LLMQ" eval --model "$out" --ppl "$TEST" --kld "$WORK/base.logits" --threads "$THREADS" \
      --json "$WORK/$key.eval.json" >"$WORK/$key.eval.txt" 2>"$WORK/$key.eval.err"
    printf '{"type":"%s","variant":"%s","bytes":%s,"quantize_s":%s,"ppl":%s,"kld":%s}\n' "$t" "$v" \
      "$(stat -c %s "$out")" "$secs" "$(jget "$WORK/$key.eval.json" 'd["ppl"]')" \
      "$(jget "$WORK/$key.eval.json" 'd["kld"]["kld_mean"]')" >"$WORK/$key.json"
    rm -f "$out"
    echo "$t $v: $(cat "$WORK/$key.json")" >&2
  done
done

printf '\nSmolLM2-135M f32 base: PPL %s on %s chunks; calib wiki.valid %sx%s\n' \
  "$(jget "$WORK/base.json" 'd["ppl"]')" "$CHUNKS" "$NSAMPLES" "$SEQLEN"
printf '%-8s %-14s %9s %10s %10s %9s\n' type variant MiB PPL KLD "quant s"
for t in $TYPES; do
  for v in $VARIANTS; do
    f="$WORK/${t}_${v}.json"; [[ -f "$f" ]] || continue
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1]));
print("%-8s %-14s %9.2f %10.4f %10.6f %9.1f" % (d["type"], d["variant"], d["bytes"]/2**20, d["ppl"], d["kld"], d["quantize_s"]))' "$f"
  done
done
