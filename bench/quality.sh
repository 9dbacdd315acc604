#!/usr/bin/env bash
# bench/quality.sh — perplexity of SmolLM2-135M quantized by RTN, GPTQ, AWQ and AWQ+GPTQ at 4 and 3 bits
# (group 64, asym), next to the base model, as one table (issue 4's quality gate).
#
#   bench/quality.sh [--quick]
# Base: ~/.cache/llmq/smollm2-f32.gguf (the f32 dequantization of SmolLM2-135M-Instruct.Q4_1.gguf; made
#   with `llmq convert` when missing). Calibration: wiki.valid.raw, NSAMPLES windows of SEQLEN tokens
#   (seed 0). Evaluation: wiki.test.raw, `llmq eval` llamacpp protocol (ctx 512), CHUNKS chunks (-1: all).
# Full (the issue's protocol): NSAMPLES=128 SEQLEN=512 CHUNKS=-1. --quick: NSAMPLES=8 SEQLEN=256 CHUNKS=20.
# Environment overrides: NSAMPLES, SEQLEN, CHUNKS, THREADS (default nproc), BITS ("4 3"), METHODS
#   ("rtn gptq gptq-ao awq awq+gptq"; gptq-ao = gptq --act-order, gptq-gar = gptq --act-group-aware,
#   awq+gptq-gar = awq+gptq --act-group-aware, gptaq = gptq --gptaq, gptaq-ao = gptq --gptaq --act-order,
#   gptaq-gar = gptq --gptaq --act-group-aware; a -mse / -hmse suffix adds --grid mse / hmse, e.g. gptq-hmse,
#   gptq-ao-hmse, awq+gptq-hmse, gptaq-hmse), BUILD_DIR (default <repo>/build), LLMQ_CACHE, LLMQ_DATA, KEEP=1 (keep outputs),
#   WORK (a directory to keep logs in; default a new /tmp/llmq_quality.XXXXXX). Resumable: with a fixed WORK, a
#   (method, bits) whose eval log already holds a final estimate is not run again (nor is the base), so a long full
#   run that was interrupted continues where it stopped. Each finished run appends a line to $WORK/results.tsv.
# Output (stdout): one row per (method, bits): PPL, ΔPPL vs base, share of RTN's increase removed (RTN's PPL
#   from this run or from $WORK), quantize seconds and peak RSS (GNU time). Logs of every run go to $WORK (printed).
#   results.tsv columns: method, bits, PPL, quantize s, peak RSS kB, and the source tree's commit when the row
#   started (`git describe --always --dirty`; BUILD_DIR must have been built from it — not checked).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
if [[ $QUICK == 1 ]]; then
  NSAMPLES="${NSAMPLES:-8}"; SEQLEN="${SEQLEN:-256}"; CHUNKS="${CHUNKS:-20}"
else
  NSAMPLES="${NSAMPLES:-128}"; SEQLEN="${SEQLEN:-512}"; CHUNKS="${CHUNKS:--1}"
fi
THREADS="${THREADS:-$(nproc)}"
BITS="${BITS:-4 3}"
METHODS="${METHODS:-rtn gptq gptq-ao awq awq+gptq}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
TEST="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
WORK="${WORK:-$(mktemp -d /tmp/llmq_quality.XXXXXX)}"
mkdir -p "$WORK"
COMMIT=$(git -C "$SRC" describe --always --dirty 2>/dev/null || echo unknown)
echo "source $COMMIT; base $BASE; calibration wikitext-2-valid ${NSAMPLES}x${SEQLEN} seed 0; eval $TEST llamacpp ctx 512, chunks $CHUNKS; group 64; threads $THREADS; logs in $WORK" >&2

final() { [[ -f "$1" ]] && bench_final_ppl "$1"; }
ppl() { # model log -> PPL
  if [[ -n "$(final "$2")" ]]; then final "$2"; return; fi
  "$LLMQ" eval --model "$1" --ppl "$TEST" --protocol llamacpp --chunks "$CHUNKS" --threads "$THREADS" >"$2" 2>"$2.err"
  bench_final_ppl "$2"
}

BASE_PPL=$(ppl "$BASE" "$WORK/base.txt")
echo "base: PPL $BASE_PPL" >&2
declare -A P SECS RSS
for b in $BITS; do
  for m in $METHODS; do
    out="$WORK/q_${m}_${b}"
    if [[ -n "$(final "$WORK/eval_${m}_${b}.txt")" && -f "$WORK/q_${m}_${b}.secs" ]]; then
      P[$m$b]=$(final "$WORK/eval_${m}_${b}.txt"); SECS[$m$b]=$(cat "$WORK/q_${m}_${b}.secs")
      RSS[$m$b]=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/q_${m}_${b}.log")
      echo "$m $b-bit: PPL ${P[$m$b]} (kept from an earlier run in $WORK)" >&2
      continue
    fi
    cal=()
    meth=(--method "$m")
    [[ $m == gptq-ao ]] && meth=(--method gptq --act-order)
    [[ $m == gptq-gar ]] && meth=(--method gptq --act-group-aware)
    [[ $m == awq+gptq-gar ]] && meth=(--method awq+gptq --act-group-aware)
    case $m in *-mse) meth+=(--grid mse); meth[1]=${meth[1]%-mse} ;; *-hmse) meth+=(--grid hmse); meth[1]=${meth[1]%-hmse} ;; esac
    [[ ${meth[1]} == gptq-ao ]] && meth=(--method gptq --act-order "${meth[@]:2}")
    [[ ${meth[1]} == gptq-gar ]] && meth=(--method gptq --act-group-aware "${meth[@]:2}")
    [[ ${meth[1]} == gptaq ]] && meth=(--method gptq --gptaq "${meth[@]:2}")
    [[ ${meth[1]} == gptaq-ao ]] && meth=(--method gptq --gptaq --act-order "${meth[@]:2}")
    [[ ${meth[1]} == gptaq-gar ]] && meth=(--method gptq --gptaq --act-group-aware "${meth[@]:2}")
    [[ $m != rtn ]] && cal=(--calib wikitext-2-valid --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 0)
    t0=$(date +%s.%N)
    /usr/bin/time -v "$LLMQ" quantize --model "$BASE" "${meth[@]}" --bits "$b" --group-size 64 --format fake \
      --out "$out" --threads "$THREADS" --json "$WORK/q_${m}_${b}.json" "${cal[@]}" >"$WORK/q_${m}_${b}.log" 2>&1
    SECS[$m$b]=$(echo "$(date +%s.%N) - $t0" | bc)
    echo "${SECS[$m$b]}" >"$WORK/q_${m}_${b}.secs"
    RSS[$m$b]=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/q_${m}_${b}.log")
    P[$m$b]=$(ppl "$out" "$WORK/eval_${m}_${b}.txt")
    [[ "${KEEP:-0}" == 1 ]] || rm -rf "$out"
    printf '%s %s-bit: PPL %s (%.0f s)\n' "$m" "$b" "${P[$m$b]}" "${SECS[$m$b]}" >&2
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$m" "$b" "${P[$m$b]}" "${SECS[$m$b]}" "${RSS[$m$b]}" "$COMMIT" \
      >>"$WORK/results.tsv"
  done
done

printf '\nSmolLM2-135M (f32 base from Q4_1), wiki.test llamacpp ctx 512 chunks %s; calib wiki.valid %sx%s; group 64 asym\n' \
  "$CHUNKS" "$NSAMPLES" "$SEQLEN"
printf '%-10s %4s %10s %10s %14s %9s %10s\n' method bits PPL dPPL "of RTN's d" "quant s" "peak MB"
printf '%-10s %4s %10s %10s %14s %9s %10s\n' base 32 "$BASE_PPL" - - - -
for b in $BITS; do
  [[ -z "${P[rtn$b]:-}" && -n "$(final "$WORK/eval_rtn_${b}.txt")" ]] && P[rtn$b]=$(final "$WORK/eval_rtn_${b}.txt")
  for m in $METHODS; do
    p=${P[$m$b]}
    d=$(echo "$p - $BASE_PPL" | bc -l)
    rem="-"
    if [[ -n "${P[rtn$b]:-}" && $m != rtn ]]; then
      rem=$(echo "scale=1; 100 * (${P[rtn$b]} - $p) / (${P[rtn$b]} - $BASE_PPL)" | bc -l)"% removed"
    fi
    printf '%-10s %4s %10.4f %10.4f %14s %9.0f %10.0f\n' "$m" "$b" "$p" "$d" "$rem" "${SECS[$m$b]}" \
      "$(echo "${RSS[$m$b]:-0} / 1024" | bc -l)"
  done
done
