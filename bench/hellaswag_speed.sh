#!/usr/bin/env bash
# bench/hellaswag_speed.sh — `llmq eval --tasks hellaswag` next to llama.cpp's `llama-perplexity --hellaswag`
# on the same GGUF, the same N tasks (llama-perplexity's selection: llmq --protocol llamacpp --limit N picks the
# same items) and the same thread count, in one run.
#
#   bench/hellaswag_speed.sh [MODEL ($LLMQ_CACHE/smollm2-f32.gguf)] [TASKS (400)] [THREADS (nproc)]
# Environment: BUILD_DIR (default <repo>/build); llama-perplexity from bench/llama_tools.sh.
#
# llmq: its tokens (every ending as a sequence from position 0, the context recomputed per ending) and the
#   seconds of the task loop, from `llmq eval --json` (model loading excluded).
# llama.cpp: its tokens and seconds as it reports them ("prompt eval time = X ms / N tokens": the shared
#   context evaluated once per task, model loading excluded).
# Both do the same work per task (4 endings scored), so items/s is the like-for-like figure; tokens/s is
# printed for each as counted by itself, and llmq's token count over llama.cpp's time as a third line.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
MODEL="${1:-$CACHE/smollm2-f32.gguf}"
TASKS="${2:-400}"
THREADS="${3:-$(nproc)}"
[[ $# -ge 1 ]] || bench_smollm2_f32 "$MODEL"
bench_build llmq
TOOLS="$("$SRC/bench/llama_tools.sh")"
bench_tmpdir WORK
gunzip -c "$SRC/datasets/data/hellaswag.part1.txt.gz" "$SRC/datasets/data/hellaswag.part2.txt.gz" > "$WORK/hs.txt"

echo "model $MODEL, $TASKS hellaswag tasks, $THREADS threads" >&2
"$TOOLS/llama-perplexity" -m "$MODEL" -f "$WORK/hs.txt" --hellaswag --hellaswag-tasks "$TASKS" -t "$THREADS" \
  -np 8 > "$WORK/llama.log" 2>&1
"$LLMQ" eval --model "$MODEL" --tasks "hellaswag=$WORK/hs.txt" --protocol llamacpp --emulate llamacpp-cpu \
  --limit "$TASKS" --threads "$THREADS" --json "$WORK/llmq.json" > "$WORK/llmq.log" 2>&1

"$PY" - "$WORK" "$TASKS" <<'EOF'
import json, re, sys
work, n = sys.argv[1], int(sys.argv[2])
t = json.load(open(f"{work}/llmq.json"))["tasks"][0]
log = open(f"{work}/llama.log").read()
m = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log)
acc = re.findall(r"^\d+\t([\d.]+)%\t\[", log, re.M)
l_s, l_tok = float(m.group(1)) / 1000, int(m.group(2))
print(f"llama-perplexity: {n} tasks in {l_s:.1f} s, {l_tok} tokens, {l_tok / l_s:.0f} tokens/s, "
      f"{n / l_s:.2f} tasks/s, acc_norm {float(acc[-1]):.2f}")
print(f"llmq:             {n} tasks in {t['seconds']:.1f} s, {t['tokens']} tokens, {t['tokens_per_s']:.0f} tokens/s, "
      f"{n / t['seconds']:.2f} tasks/s, acc {100 * t['acc']:.2f}")
print(f"llmq's tokens over llama.cpp's time: {t['tokens'] / l_s:.0f} tokens/s")
print(f"ratio llmq / llama.cpp (tasks/s): {l_s / t['seconds']:.2f}x")
EOF
