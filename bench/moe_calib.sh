#!/usr/bin/env bash
# bench/moe_calib.sh LLMQ MODEL_DIR WORK [BITS] [GROUP]: --moe-calib routed vs all on a mixture-of-experts model.
# For each calibration size (32 x 256 and 4 x 64 tokens of wikitext-2-valid) and each mode: GPTQ into --format gptq,
# then the KL divergence from the f32 model on 16 chunks of 256 tokens of wikitext-2-test (llmq eval --kld-base),
# and the mean per-layer err of the experts from --json (each mode's own statistics: in-sample for routed, over
# every token for all, so the KLD is the comparable figure). One line per run.
set -euo pipefail
LLMQ=$1 M=$2 W=$3 BITS=${4:-4} G=${5:-16}
mkdir -p "$W"
for cal in "32 256" "4 64"; do
    set -- $cal
    for mode in routed all; do
        out="$W/q-$1x$2-$mode"
        "$LLMQ" quantize --model "$M" --method gptq --format gptq --bits "$BITS" --group-size "$G" \
            --calib wikitext-2-valid --nsamples "$1" --seqlen "$2" --moe-calib "$mode" --moe-token-floor 0 \
            --out "$out" --json "$out.json" --force --quiet >/dev/null
        "$LLMQ" eval --model "$out" --kld-base "$M" --ppl wikitext-2 --ctx 256 --chunks 16 --json "$out.eval.json" \
            --force --quiet >/dev/null
        "${PYTHON:-python3}" - "$out.json" "$out.eval.json" "$1x$2" "$mode" <<'PY'
import json, sys
q, e = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ex = [r["err"] for r in q["layers"] if "expert" in r]
k = e["kld"]
print(f"calib {sys.argv[3]:7s} {sys.argv[4]:6s} mean KLD {k['kld_mean']:.5f} +- {k['kld_uncertainty']:.5f}  "
      f"same top-1 {100 * k['same_top_p']:.1f} %  experts' mean err {sum(ex) / len(ex):.4e} ({len(ex)} expert linears)")
PY
    done
done
