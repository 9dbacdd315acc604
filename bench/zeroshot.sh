#!/usr/bin/env bash
# bench/zeroshot.sh — zero-shot accuracy of SmolLM2-135M quantized by RTN, GPTQ, AWQ and AWQ+GPTQ at 4 and 3
# bits (group 64, asym, --format fake), next to the base model: `llmq eval --tasks` on the six tasks, lm-eval
# protocol, acc / acc_norm with their standard errors, as one markdown table (README's zero-shot table).
#
#   bench/zeroshot.sh [--quick]
#   WORK=DIR bench/zeroshot.sh --table   # print the tables of what DIR holds now (a partial run: the models
#                                        # not evaluated yet are marked so); runs nothing
# Base: ~/.cache/llmq/smollm2-f32.gguf (the f32 dequantization of SmolLM2-135M-Instruct.Q4_1.gguf; made with
#   `llmq convert` when missing). Calibration (all but RTN): wiki.valid.raw, NSAMPLES windows of SEQLEN tokens,
#   seed 0. Tasks: TASKS (default all), the first LIMIT items of each (-1: every item of the file).
# Defaults: NSAMPLES=16 SEQLEN=512 LIMIT=-1. --quick: NSAMPLES=4 SEQLEN=256 LIMIT=20 BITS=4 METHODS="rtn gptq".
# Environment overrides: NSAMPLES, SEQLEN, LIMIT, TASKS, THREADS (default nproc), BITS ("4 3"), METHODS
#   ("rtn gptq awq awq+gptq"), PIPELINE (1: quantize every model in one background job while the evaluations
#   run, each model evaluated as soon as its quantization is there; THREADS threads each; default 0), BUILD_DIR,
#   LLMQ_CACHE, LLMQ_DATA, WORK (a directory to keep the quantized models, logs and JSON reports in; default a
#   new /tmp/llmq_zeroshot.XXXXXX). Resumable: with a fixed WORK, a
#   model whose quantization finished (its JSON report exists) is not quantized again, and a model whose task
#   JSON exists is not evaluated again, so an interrupted run continues where it stopped; a result is kept only
#   when its .args stamp matches the current settings (TASKS, LIMIT, calibration), so changing them redoes it,
#   except that a run of more items is cut to the first LIMIT; an interrupted quantization resumes from its
#   checkpoint. Two instances on one WORK with disjoint BITS (or METHODS) may run at once; not the same model.
#   The eval JSON has every item's choice and scores (--json-items), for item-by-item comparisons.
# Output (stdout): one markdown row per model: per task acc ± stderr (and acc_norm where the task defines it),
#   in %, then the mean acc over the tasks; then each model's change against the base with the paired standard
#   error (bench/zeroshot_table.py). Each model's figures are in $WORK/eval_<model>.json.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
QUICK=0 TABLE=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
[[ "${1:-}" == "--table" ]] && TABLE=1
if [[ $QUICK == 1 ]]; then
  NSAMPLES="${NSAMPLES:-4}"; SEQLEN="${SEQLEN:-256}"; LIMIT="${LIMIT:-20}"; BITS="${BITS:-4}"
  METHODS="${METHODS:-rtn gptq}"
else
  NSAMPLES="${NSAMPLES:-16}"; SEQLEN="${SEQLEN:-512}"; LIMIT="${LIMIT:--1}"; BITS="${BITS:-4 3}"
  METHODS="${METHODS:-rtn gptq awq awq+gptq}"
fi
TASKS="${TASKS:-all}"
THREADS="${THREADS:-$(nproc)}"
PIPELINE="${PIPELINE:-0}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
WORK="${WORK:-$(mktemp -d /tmp/llmq_zeroshot.XXXXXX)}"
mkdir -p "$WORK"
COMMIT=$(git -C "$SRC" describe --always --dirty 2>/dev/null || echo unknown)
echo "source $COMMIT; base $BASE; calibration wikitext-2-valid ${NSAMPLES}x${SEQLEN} seed 0; tasks $TASKS limit $LIMIT lm-eval protocol; group 64; threads $THREADS; work in $WORK" >&2

# A kept result is reused only when it was made with the same settings: each result has a .args stamp next to
# it (the settings it was made with); a missing or different stamp means evaluate / quantize again.
kept() { # result-file settings
  [[ -f "$1" && -f "$1.args" && "$(cat "$1.args")" == "$2" ]]
}

evaluate() { # model name
  local json="$WORK/eval_$2.json" args="tasks $TASKS limit $LIMIT protocol lm-eval model $1"
  kept "$json" "$args" && { echo "$2: tasks kept from an earlier run ($json)" >&2; return; }
  # a kept run of the first L > LIMIT items (or of all) is cut to its first LIMIT items: the same choices and
  # figures as a run of LIMIT items (bench/zeroshot_table.py --cut; checked on SmolLM2: 400 cut to 300 equals
  # the 300 run); the longer run is kept as eval_<model>.limit<L>.json
  local src a l
  for src in "$json" "$WORK/eval_$2".limit*.json; do
    [[ $LIMIT != -1 && -f $src && -f $src.args ]] || continue
    a=$(cat "$src.args")
    l=$(awk '{print $4}' <<<"$a")
    [[ "${a/ limit $l / limit $LIMIT }" == "$args" ]] && { [[ $l == -1 ]] || ((l > LIMIT)); } || continue
    if [[ $src == "$json" ]]; then
      src="$WORK/eval_$2.limit$l.json"
      mv "$json" "$src" && mv "$json.args" "$src.args"
    fi
    python3 "$SRC/bench/zeroshot_table.py" --cut "$src" "$json" "$LIMIT"
    echo "$args" >"$json.args"
    echo "$2: the first $LIMIT items cut from the run of $l ($src)" >&2
    return
  done
  rm -f "$json" "$json.args"
  local t0=$SECONDS
  "$LLMQ" eval --model "$1" --tasks "$TASKS" --limit "$LIMIT" --protocol lm-eval --threads "$THREADS" \
    --json "$json.part" --json-items --force >"$WORK/eval_$2.txt" 2>"$WORK/eval_$2.err"
  mv "$json.part" "$json"
  echo "$args" >"$json.args"
  echo "$2: tasks done in $((SECONDS - t0)) s" >&2
}

qargs_of() { # method bits: the settings stamp of that quantized model
  local cal=""
  [[ $1 != rtn ]] && cal=" --calib wikitext-2-valid --nsamples $NSAMPLES --seqlen $SEQLEN --seed 0"
  echo "method $1 bits $2 group 64 format fake$cal"
}

quantize() { # method bits
  local name="$1_$2" out="$WORK/q_$1_$2" qargs t0=$SECONDS cal=()
  qargs=$(qargs_of "$1" "$2")
  kept "$WORK/q_$name.json" "$qargs" && return
  # a new model invalidates its evaluation
  rm -rf "$out" "$WORK/q_$name.json" "$WORK/q_$name.json.args" "$WORK/eval_$name.json" "$WORK/eval_$name.json.args"
  [[ $1 != rtn ]] && cal=(--calib wikitext-2-valid --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 0)
  # --resume: an interrupted quantization continues from its checkpoint $out.partial (byte-identical)
  "$LLMQ" quantize --model "$BASE" --method "$1" --bits "$2" --group-size 64 --format fake --out "$out" \
    --resume --threads "$THREADS" --json "$WORK/q_$name.json.part" "${cal[@]}" >"$WORK/q_$name.log" 2>&1
  mv "$WORK/q_$name.json.part" "$WORK/q_$name.json"
  echo "$qargs" >"$WORK/q_$name.json.args"
  echo "$name: quantized in $((SECONDS - t0)) s" >&2
}

MODELS=(base)
for b in $BITS; do for m in $METHODS; do MODELS+=("${m}_${b}"); done; done
tables() {
  printf '\nSmolLM2-135M (f32 base from Q4_1); `llmq eval --tasks %s --limit %s` (lm-eval protocol); calibration wiki.valid %sx%s seed 0; group 64 asym; source %s\n\n' \
    "$TASKS" "$LIMIT" "$NSAMPLES" "$SEQLEN" "$COMMIT"
  python3 "$SRC/bench/zeroshot_table.py" "$WORK" "${MODELS[@]}"
}
if [[ $TABLE == 1 ]]; then # the tables of what WORK holds now, nothing run
  tables
  exit 0
fi
QPID=
if [[ $PIPELINE == 1 ]]; then
  # every quantization in one background job, in table order; each model is evaluated once it is there
  (for b in $BITS; do for m in $METHODS; do quantize "$m" "$b"; done; done) &
  QPID=$!
fi
evaluate "$BASE" base
for b in $BITS; do
  for m in $METHODS; do
    if [[ -n $QPID ]]; then
      until kept "$WORK/q_${m}_$b.json" "$(qargs_of "$m" "$b")"; do
        kill -0 "$QPID" 2>/dev/null || { echo "error: quantization of ${m}_$b failed ($WORK/q_${m}_$b.log)" >&2; exit 1; }
        sleep 10
      done
    else
      quantize "$m" "$b"
    fi
    evaluate "$WORK/q_${m}_$b" "${m}_$b"
  done
done
[[ -z $QPID ]] || wait "$QPID"

tables
