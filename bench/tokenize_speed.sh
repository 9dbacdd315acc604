#!/usr/bin/env bash
# bench/tokenize_speed.sh — tokenizer throughput of llmq next to llama.cpp's (llama-cpp-python,
# Llama(vocab_only=True).tokenize) on the same GGUF and the same text, one thread each, one run.
#
#   bench/tokenize_speed.sh [REPS (7)] [MODEL.gguf ...]
# Environment: BUILD_DIR (default <repo>/build), LLMQ_PYTHON (default ~/.cache/llmq/venv/bin/python),
#              LLMQ_DATA (default <repo>/../shared/datasets), LLMQ_CACHE (default ~/.cache/llmq),
#              TEXT (default $LLMQ_DATA/wikitext-2-raw/wiki.test.raw).
# Models: SmolLM2-135M-Instruct.Q4_1.gguf and stories260K (v3) unless given.
# Prints one table: tokens, median tokens/s of llmq and of llama.cpp, the ratio, and whether the
# two id sequences are identical.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
TEXT="${TEXT:-$LLMQ_DATA/wikitext-2-raw/wiki.test.raw}"
REPS="${1:-7}"
shift || true
MODELS=("$@")
if [[ ${#MODELS[@]} -eq 0 ]]; then
  MODELS=("$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" "$LLMQ_DATA/models/stories260K/tinyllamas-stories-260k-f32.v3.gguf")
fi
bench_build bench_tokenize_speed tokenize_tool
bench_tmpdir WORK
printf "%-44s %9s %14s %14s %7s %s\n" model tokens "llmq tok/s" "llama.cpp tok/s" ratio identical
for m in "${MODELS[@]}"; do
  read -r n_llmq _ tps_llmq _ < <("$BUILD_DIR/bench/bench_tokenize_speed" "$m" "$TEXT" "$REPS")
  "$BUILD_DIR/tests/tokenize_tool" "$m" "$TEXT" 2>/dev/null >"$WORK/llmq.ids"
  "$PY" - "$m" "$TEXT" "$REPS" "$n_llmq" "$tps_llmq" "$WORK/llmq.ids" <<'PYEOF'
import statistics, sys, time
import llama_cpp
model, text, reps, n_llmq, tps_llmq, ids_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
m = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
data = open(text, "rb").read()
secs = []
for _ in range(reps):
    t0 = time.perf_counter()
    ids = m.tokenize(data, add_bos=True, special=False)
    secs.append(time.perf_counter() - t0)
tps = len(ids) / statistics.median(secs)
same = open(ids_file).read().split() == [str(i) for i in ids]
print("%-44s %9d %14.0f %14.0f %6.2fx %s" % (model.split("/")[-1], n_llmq, tps_llmq, tps, tps_llmq / tps, "yes" if same else "NO"))
PYEOF
done
