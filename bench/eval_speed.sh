#!/usr/bin/env bash
# bench/eval_speed.sh — perplexity throughput of `llmq eval` next to llama.cpp (llama-cpp-python) on
# the same GGUF, the same text and chunks (llamacpp protocol) and the same thread count, in one run.
#
#   bench/eval_speed.sh [MODEL (~/.cache/llmq/SmolLM2-135M-Instruct.Q4_1.gguf)] [CHUNKS (4)] [THREADS (nproc)] [CTX (512)]
# Environment: BUILD_DIR (default <repo>/build), LLMQ_PYTHON (default ~/.cache/llmq/venv/bin/python),
#              TEXT (default ../shared/datasets/wikitext-2-raw/wiki.test.raw), REPS (default 3),
#              DEVICE (llmq's --device, default auto: cuda takes eval's device block path, calib/eval/eval.h).
#
# llmq: tokens/s of the chunk loop as `llmq eval --json` reports it (forward pass + log-softmax
#   scoring of every chunk; model loading and tokenization excluded).
# llama.cpp: the decode of the same chunks as llama-perplexity issues it (one batch of CTX tokens per
#   chunk, logits requested for positions >= CTX/2 only, KV cache cleared between chunks; the
#   context's default KV type and attention path), logits copied out; its scoring is NOT timed, so
#   the comparison leans in llama.cpp's favour.
# Prints the median tokens/s of REPS runs of each and the ratio llmq / llama.cpp.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
MODEL="${1:-$HOME/.cache/llmq/SmolLM2-135M-Instruct.Q4_1.gguf}"
CHUNKS="${2:-4}"
THREADS="${3:-$(nproc)}"
CTX="${4:-512}"
REPS="${REPS:-3}"
DEVICE="${DEVICE:-auto}"
TEXT="${TEXT:-$SRC/../shared/datasets/wikitext-2-raw/wiki.test.raw}"

bench_build llmq
"$PY" -c "import llama_cpp" 2>/dev/null || { echo "error: llama_cpp is not importable by $PY" >&2; exit 1; }

bench_tmpdir WORK
echo "model $MODEL, $CHUNKS chunks of $CTX, $THREADS threads, $REPS runs each" >&2
for i in $(seq "$REPS"); do
  "$LLMQ" eval --model "$MODEL" --ppl "$TEXT" --ctx "$CTX" --chunks "$CHUNKS" --threads "$THREADS" \
    --device "$DEVICE" --json "$WORK/llmq_$i.json" >/dev/null 2>"$WORK/llmq_$i.log"
  echo "llmq run $i: $(grep -o '"tokens_per_s": [0-9.]*' "$WORK/llmq_$i.json")" >&2
done

OMP_NUM_THREADS="$THREADS" "$PY" - "$MODEL" "$TEXT" "$CHUNKS" "$THREADS" "$CTX" "$REPS" "$WORK" <<'EOF'
import glob, json, statistics, sys, time
import numpy as np
import llama_cpp as L

model, text, chunks, threads, ctx, reps, work = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7]
raw = open(text, "rb").read()
raw = raw[:-1] if raw.endswith(b"\n") else raw  # as llama-perplexity -f reads it
llm = L.Llama(model_path=model, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx, n_threads=threads, n_threads_batch=threads,
              verbose=False)
tokens = llm.tokenize(raw, add_bos=True, special=False)
add_bos, bos = bool(llm._model.add_bos_token()), llm.token_bos()
n_vocab, first = llm.n_vocab(), ctx // 2
cptr = llm._ctx.ctx
batch = L.llama_batch_init(ctx, 0, 1)

def one_run():
    t0 = time.perf_counter()
    for k in range(chunks):
        L.llama_memory_clear(L.llama_get_memory(cptr), True)
        toks = tokens[k * ctx:(k + 1) * ctx]
        if add_bos:
            toks[0] = bos
        batch.n_tokens = ctx
        for i, t in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = t, i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if i >= first else 0
        if L.llama_decode(cptr, batch) != 0:
            raise SystemExit("llama_decode failed")
        np.ctypeslib.as_array(L.llama_get_logits(cptr), shape=((ctx - first) * n_vocab,)).copy()
    return chunks * ctx / (time.perf_counter() - t0)

one_run() if chunks > 1 else None  # warm-up (page cache, thread pool)
lc = []
for i in range(reps):
    lc.append(one_run())
    print(f"llama.cpp run {i + 1}: {lc[-1]:.1f} tokens/s", file=sys.stderr)
L.llama_batch_free(batch)
lq = [json.load(open(p))["tokens_per_s"] for p in sorted(glob.glob(f"{work}/llmq_*.json"))]
ml, mc = statistics.median(lq), statistics.median(lc)
print(f"{'':10} {'tokens/s (median of ' + str(reps) + ')':>26}")
print(f"{'llmq':10} {ml:26.1f}")
print(f"{'llama.cpp':10} {mc:26.1f}")
print(f"ratio llmq / llama.cpp: {ml / mc:.2f}x   ({chunks} chunks of {ctx}, {threads} threads, {model.split('/')[-1]})")
EOF
