#!/usr/bin/env bash
# bench/hellaswag_speed.sh — `llmq eval --tasks hellaswag` next to llama.cpp's `llama-perplexity --hellaswag`
# on the same GGUF, the same N tasks (llama-perplexity's selection: llmq --protocol llamacpp --limit N picks the
# same items) and the same thread count, in one run.
#
#   bench/hellaswag_speed.sh [MODEL ($LLMQ_CACHE/smollm2-f32.gguf)] [TASKS (400)] [THREADS (nproc)]
# Environment: BUILD_DIR (default <repo>/build); llama-perplexity from bench/llama_tools.sh; KERNELS: the OpenBLAS
#   kernels of the llmq run, "native" (default: OPENBLAS_CORETYPE unset, OpenBLAS's own choice for this CPU, as
#   llama.cpp is built for it) or an OPENBLAS_CORETYPE value ("env": keep the environment's). The kernels in use
#   are printed.
#
# llmq: the seconds of the task loop and its tokens (through the model: each task's shared context once, plus
#   every ending with the context's last token; calib/eval/tasks.h), from `llmq eval --json` (model loading
#   excluded).
# llama.cpp: the wall time of the run minus the time stamp of its "calculating hellaswag score" log line
#   (model loading and tokenization excluded); it prints no token count. It too evaluates the shared context
#   once per task (and each ending after it), so the two token counts differ by one token per ending.
# Both do the same work per task (4 endings scored), so tasks/s is the like-for-like figure; tokens/s is
# given for both with llmq's token count. Also printed: how many of the TASKS per-item verdicts agree
# (llama-perplexity's running acc_norm lines against llmq's --json-items), and each whole process's CPU seconds
# (user + system, GNU time; loading included), whose ratio a shared machine disturbs less than the wall times'.
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

KERNELS="${KERNELS:-native}"
kenv=()
case "$KERNELS" in
  native) kenv=(env -u OPENBLAS_CORETYPE) ;;
  env) kenv=(env) ;;
  *) kenv=(env "OPENBLAS_CORETYPE=$KERNELS") ;;
esac
echo "model $MODEL, $TASKS hellaswag tasks, $THREADS threads; llmq's $("${kenv[@]}" "$LLMQ" --version | tail -1)" >&2
t0=$(date +%s.%N)
/usr/bin/time -f "%U %S" -o "$WORK/llama.cpu" "$TOOLS/llama-perplexity" -m "$MODEL" -f "$WORK/hs.txt" --hellaswag \
  --hellaswag-tasks "$TASKS" -t "$THREADS" -np 8 > "$WORK/llama.log" 2>&1
t1=$(date +%s.%N)
"${kenv[@]}" /usr/bin/time -f "%U %S" -o "$WORK/llmq.cpu" "$LLMQ" eval --model "$MODEL" --tasks "hellaswag=$WORK/hs.txt" \
  --protocol llamacpp --emulate llamacpp-cpu --limit "$TASKS" --threads "$THREADS" --json "$WORK/llmq.json" \
  --json-items > "$WORK/llmq.log" 2>&1

"$PY" - "$WORK" "$TASKS" "$t0" "$t1" <<'EOF'
import json, re, sys
work, n, t0, t1 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cpu = {k: sum(map(float, open(f"{work}/{k}.cpu").read().split()[-2:])) for k in ("llama", "llmq")}
t = json.load(open(f"{work}/llmq.json"))["tasks"][0]
log = open(f"{work}/llama.log").read()
m = re.search(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) I hellaswag_score : calculating", log, re.M)
setup = int(m.group(1)) * 60 + int(m.group(2)) + int(m.group(3)) / 1e3 + int(m.group(4)) / 1e6
acc = re.findall(r"^\d+\t([\d.]+)%\t\[", log, re.M)
l_s = t1 - t0 - setup
correct, prev = [], 0  # per-item correctness from the running accuracy (100 * correct / i)
for i, v in enumerate(map(float, acc), 1):
    k = round(v * i / 100)
    correct.append(k - prev)
    prev = k
ours = [i["pred"] == i["gold"] for i in t["per_item"]]
agree = sum(int(a) == b for a, b in zip(ours, correct))
print(f"llama-perplexity: {n} tasks in {l_s:.1f} s, {n / l_s:.2f} tasks/s, {t['tokens'] / l_s:.0f} tokens/s "
      f"(llmq's count), acc_norm {float(acc[-1]):.2f}")
print(f"llmq:             {n} tasks in {t['seconds']:.1f} s, {n / t['seconds']:.2f} tasks/s, {t['tokens_per_s']:.0f} "
      f"tokens/s ({t['tokens']} tokens), acc {100 * t['acc']:.2f}")
print(f"ratio llmq / llama.cpp (tasks/s): {l_s / t['seconds']:.2f}x")
print(f"per-item verdicts agree: {agree} of {len(correct)}")
print(f"CPU seconds (whole process): llama-perplexity {cpu['llama']:.1f}, llmq {cpu['llmq']:.1f}; "
      f"ratio {cpu['llama'] / cpu['llmq']:.2f}x")
EOF
