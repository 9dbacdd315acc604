#!/usr/bin/env bash
# bench/gguf_choice.sh — the type choice at equal size (quant/gguf_choose.h): llama.cpp's own imatrix +
# llama-quantize mix against llmq's --mix quality and --target-size on the same importance, every file judged
# by llama.cpp's llama-perplexity (PPL and mean KLD against the base's logits).
#
#   bench/gguf_choice.sh [--quick]
# Base: ~/.cache/llmq/smollm2-f32.gguf (the f32 decoding of SmolLM2-135M-Instruct.Q4_1.gguf, so Q4_1 rebuilds
#   every linear exactly: the *-x rows exclude it with --mix-exclude q4_1 and are the fair comparison).
# Importance: llama-imatrix over the first NSAMPLES chunks of SEQLEN tokens of wiki.valid.raw, used by both
#   llama-quantize --imatrix and llmq --imatrix (the same file, so the rows differ only in the types, and GPTQ).
# Rows per TYPE:
#   lcpp          llama-quantize --imatrix imat.dat BASE OUT TYPE
#   quality       llmq --method rtn --imatrix imat.dat --gguf-type TYPE --mix quality
#   quality-x     the same with --mix-exclude q4_1
#   target        llmq ... --target-size (lcpp's tensor data bytes, from llmq's dry run of the llama mix, which is
#                 byte-identical to llama-quantize's file)
#   target-x      the same with --mix-exclude q4_1
#   target-xx     the same with --mix-exclude q4_1,q5_1 (Q5_1's 32-blocks with a minimum also sit close to the
#                 base's Q4_1 grid; ROWS must name it)
#   target-xm     target-x with --sensitivity measured (the errors in KLD units, quant/gguf_choose.h), measured on
#                 the first SENS_WINDOWS x SENS_SEQLEN tokens of --calib wiki.valid NSAMPLES x SEQLEN seed 0 (the
#                 imatrix's windows with JUDGE=llmq); target-xxm the same for target-xx (ROWS must name them)
#   gptq-quality-x  llmq --method gptq --calib wiki.valid NSAMPLES x SEQLEN --mix quality --mix-exclude q4_1
#                 (only when GPTQ=1: minutes per file)
# Judge: llama-perplexity -c 512 --chunks CHUNKS on wiki.test.raw, --kl-divergence against the base's saved
#   logits. Full protocol: NSAMPLES=128 SEQLEN=512 CHUNKS=-1 (the base logits of all of wiki.test take GBs).
#   Default NSAMPLES=16 CHUNKS=20; --quick: TYPES=Q3_K_M CHUNKS=10.
# JUDGE=llmq (when llama.cpp's tools are not built): llmq calib's imatrix in the .dat form, the lcpp row made by llmq's
#   llama mix from it (byte-identical to llama-quantize's, tests/py/test_gguf_mix.py), `llmq eval` as the judge.
# Predicted KLD: the measured rows' own ("predicted_kld"); for every other row of the same TYPE, from the
#   first measured row's per-tensor slopes g_t = sens_kld / pred_err_mix applied to that row's per-tensor err
#   (the lcpp row: Σ sens_kld, every linear measured alone in the mix's type; a linear the mix's type rebuilds
#   exactly, err 0, gets the smallest positive slope as in the choice); "-" without a measured row.
# Environment: TYPES ("Q4_K_M Q3_K_M Q2_K"), ROWS, GPTQ, JUDGE, THREADS, SENS_WINDOWS (4), SENS_SEQLEN (256),
#   WORK (resumable: finished rows are kept), BUILD_DIR, LLMQ_CACHE, LLMQ_DATA. Output: one table on stdout;
#   $WORK/*.json one row per file.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
if [[ "${1:-}" == "--quick" ]]; then TYPES="${TYPES:-Q3_K_M}"; CHUNKS="${CHUNKS:-10}"; fi
NSAMPLES="${NSAMPLES:-16}"; SEQLEN="${SEQLEN:-512}"; CHUNKS="${CHUNKS:-20}"
TYPES="${TYPES:-Q4_K_M Q3_K_M Q2_K}"
ROWS="${ROWS:-lcpp quality quality-x target target-x}"
[[ "${GPTQ:-0}" == 1 ]] && ROWS="$ROWS gptq-quality-x"
THREADS="${THREADS:-$(nproc)}"
SENS_WINDOWS="${SENS_WINDOWS:-4}"; SENS_SEQLEN="${SENS_SEQLEN:-256}"
PY="${PYTHON:-$CACHE/venv/bin/python}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
VALID="$LLMQ_DATA/wikitext-2-raw/wiki.valid.raw"
TEST="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
WORK="${WORK:-$(mktemp -d /tmp/llmq_gguf_choice.XXXXXX)}"
mkdir -p "$WORK"
JUDGE="${JUDGE:-llama}"
[[ $JUDGE == llama ]] && TOOLS="$("$SRC/bench/llama_tools.sh")"
echo "base $BASE; imatrix ($JUDGE) wiki.valid ${NSAMPLES}x${SEQLEN}; judge $JUDGE wiki.test ctx 512 chunks $CHUNKS; threads $THREADS; work $WORK" >&2

if [[ ! -f "$WORK/imat.dat" && $JUDGE == llama ]]; then
  "$TOOLS/llama-imatrix" -m "$BASE" -f "$VALID" -o "$WORK/imat.dat" --output-format dat --chunks "$NSAMPLES" \
    -c "$SEQLEN" -t "$THREADS" >"$WORK/imat.log" 2>&1
elif [[ ! -f "$WORK/imat.dat" ]]; then # JUDGE=llmq: llmq's own imatrix (random windows), in llama-imatrix's .dat
  "$LLMQ" calib --model "$BASE" --calib "$VALID" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 0 --no-xtx \
    --threads "$THREADS" --out "$WORK/imat.lcs" --imatrix-out "$WORK/imat.dat" >"$WORK/imat.log" 2>&1
fi
if [[ ! -f "$WORK/base.kld" && $JUDGE == llama ]]; then
  "$TOOLS/llama-perplexity" -m "$BASE" -f "$TEST" -c 512 --chunks "$CHUNKS" -t "$THREADS" \
    --kl-divergence-base "$WORK/base.kld.tmp" >"$WORK/base.log" 2>&1
  mv "$WORK/base.kld.tmp" "$WORK/base.kld"
elif [[ ! -f "$WORK/base.kld" ]]; then
  "$LLMQ" eval --model "$BASE" --ppl "$TEST" --chunks "$CHUNKS" --threads "$THREADS" --save-logits "$WORK/base.kld.tmp" \
    --json "$WORK/base.json" >"$WORK/base.log" 2>&1
  mv "$WORK/base.kld.tmp" "$WORK/base.kld"
fi
jget() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$@"; }
Q=("$LLMQ" quantize --model "$BASE" --format gguf --threads "$THREADS" --force --no-provenance)

for t in $TYPES; do
  if [[ ! -f "$WORK/${t}_plan.json" ]]; then # the llama mix's tensor data bytes (= llama-quantize's file)
    "${Q[@]}" --gguf-type "$t" --imatrix "$WORK/imat.dat" --dry-run --json "$WORK/${t}_plan.json" >/dev/null 2>&1
  fi
  size=$(jget "$WORK/${t}_plan.json" 'd["totals"]["bytes"]')
  for v in $ROWS; do
    key="${t}_${v}"; out="$WORK/$key.gguf"
    [[ -f "$WORK/$key.json" ]] && continue
    x=(); [[ $v == *-x || $v == *-xm ]] && x=(--mix-exclude q4_1); [[ $v == *-xx || $v == *-xxm ]] && x=(--mix-exclude q4_1,q5_1)
    [[ $v == target-*m ]] && x+=(--sensitivity measured --calib "$VALID" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" \
      --seed 0 --sensitivity-windows "$SENS_WINDOWS" --sensitivity-seqlen "$SENS_SEQLEN")
    t0=$(date +%s.%N)
    case $v in
      lcpp) if [[ $JUDGE == llama ]]; then
              "$TOOLS/llama-quantize" --imatrix "$WORK/imat.dat" "$BASE" "$out" "$t" "$THREADS" >"$WORK/$key.log" 2>&1
            else # llmq's llama mix with the same .dat: llama-quantize's bytes (tests/py/test_gguf_mix.py)
              "${Q[@]}" --gguf-type "$t" --imatrix "$WORK/imat.dat" --out "$out" >"$WORK/$key.log" 2>&1
            fi ;;
      quality*) "${Q[@]}" --gguf-type "$t" --imatrix "$WORK/imat.dat" --mix quality "${x[@]}" --out "$out" \
                  --json "$WORK/$key.q.json" >"$WORK/$key.log" 2>&1 ;;
      target*) "${Q[@]}" --gguf-type "$t" --imatrix "$WORK/imat.dat" --target-size "$size" "${x[@]}" --out "$out" \
                 --json "$WORK/$key.q.json" >"$WORK/$key.log" 2>&1 ;;
      gptq-quality-x) "${Q[@]}" --gguf-type "$t" --method gptq --calib "$VALID" --nsamples "$NSAMPLES" \
                        --seqlen "$SEQLEN" --seed 0 --mix quality "${x[@]}" --out "$out" \
                        --json "$WORK/$key.q.json" >"$WORK/$key.log" 2>&1 ;;
    esac
    secs=$(printf "%.3f" "$(echo "$(date +%s.%N) - $t0" | bc)")
    if [[ $JUDGE == llama ]]; then
      "$TOOLS/llama-perplexity" -m "$out" -f "$TEST" -c 512 --chunks "$CHUNKS" -t "$THREADS" \
        --kl-divergence-base "$WORK/base.kld" --kl-divergence >"$WORK/$key.ppl.log" 2>&1
      ppl=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$WORK/$key.ppl.log")
      kld=$(sed -n 's/^Mean    KLD: *\([0-9.]*\).*/\1/p' "$WORK/$key.ppl.log")
    else
      "$LLMQ" eval --model "$out" --ppl "$TEST" --kld "$WORK/base.kld" --threads "$THREADS" \
        --json "$WORK/$key.eval.json" >"$WORK/$key.ppl.log" 2>&1
      ppl=$(jget "$WORK/$key.eval.json" 'd["ppl"]')
      kld=$(jget "$WORK/$key.eval.json" 'd["kld"]["kld_mean"]')
    fi
    pred=null; pkld=null
    [[ -f "$WORK/$key.q.json" ]] && pred=$(jget "$WORK/$key.q.json" 'd["totals"].get("predicted_err", "null")')
    [[ -f "$WORK/$key.q.json" ]] && pkld=$(jget "$WORK/$key.q.json" 'd["totals"].get("predicted_kld", "null")')
    tb=$("$PY" -c 'import gguf,sys; ts=gguf.GGUFReader(sys.argv[1]).tensors
print("%d,\"params\":%d" % (sum(int(t.n_bytes) for t in ts), sum(int(t.n_elements) for t in ts)))' "$out")
    printf '{"type":"%s","row":"%s","file_bytes":%s,"tensor_bytes":%s,"quantize_s":%s,"ppl":%s,"kld":%s,"predicted_err":%s,"predicted_kld":%s}\n' \
      "$t" "$v" "$(stat -c %s "$out")" "$tb" "$secs" "$ppl" "$kld" "$pred" "${pkld/None/null}" >"$WORK/$key.json"
    rm -f "$out"
    echo "$t $v: $(cat "$WORK/$key.json")" >&2
  done
done

printf '\nSmolLM2-135M f32 base (from Q4_1); imatrix (%s) wiki.valid %sx%s; judge %s on wiki.test ctx 512, %s chunks\n' \
  "$JUDGE" "$NSAMPLES" "$SEQLEN" "$JUDGE" "$CHUNKS"
printf '%-8s %-15s %12s %9s %10s %10s %13s %13s\n' type row "file bytes" bpw PPL "mean KLD" "predicted err" "predicted KLD"
for t in $TYPES; do
  # the first measured row of this type gives every linear's slope g = sens_kld / pred_err_mix
  m=""; for v in $ROWS; do [[ $v == target-*m && -f "$WORK/${t}_${v}.q.json" && -z $m ]] && m="$WORK/${t}_${v}.q.json"; done
  for v in $ROWS; do
    f="$WORK/${t}_${v}.json"; [[ -f "$f" ]] || continue
    "$PY" - "$f" "$m" "$WORK/${t}_${v}.q.json" <<'PYEOF'
import json, os, sys
d = json.load(open(sys.argv[1])); p = d["predicted_err"]; k = d.get("predicted_kld")
def tensors(path):
    r = json.load(open(path)); return {t["name"]: t for t in r.get("gguf", r)["tensors"]}
if k is None and sys.argv[2]:
    # as quant/gguf_choose.h: a tensor its mix's type rebuilds exactly (err 0) gets the smallest positive slope
    g = {n: t["sens_kld"] / t["pred_err_mix"] for n, t in tensors(sys.argv[2]).items()
         if t.get("sens_kld", 0) > 0 and t["pred_err_mix"] > 0}
    gmin = min(g.values())
    g.update({n: gmin for n, t in tensors(sys.argv[2]).items() if "sens_kld" in t and n not in g})
    if d["row"] == "lcpp":
        k = sum(t["sens_kld"] for t in tensors(sys.argv[2]).values() if t.get("sens_kld"))
    elif os.path.exists(sys.argv[3]):
        k = sum(g[n] * t["pred_err"] for n, t in tensors(sys.argv[3]).items() if n in g)
print("%-8s %-15s %12d %9.4f %10.4f %10.6f %13s %13s" % (d["type"], d["row"], d["file_bytes"],
      8 * d["tensor_bytes"] / d["params"], d["ppl"], d["kld"], "-" if p is None else "%.6g" % p,
      "-" if k is None else "%.6g" % k))
PYEOF
  done
done
