#!/usr/bin/env bash
# tests/py/gen_golden_imatrix.sh — regenerate the llama-imatrix fixtures of tests/py/test_imatrix_gguf.py:
#
#   tests/golden/imatrix_stories260k.gguf   llama-imatrix's default output (GGUF: *.in_sum2, *.counts,
#                                           imatrix.datasets / chunk_count / chunk_size)
#   tests/golden/imatrix_stories260k.dat    its twin from the same computation, --output-format dat
#
# made by the real llama-imatrix of the llama.cpp vendored in llama-cpp-python 0.3.36 (bench/llama_tools.sh
# builds it, ~10+ min on 2 cores) over the first 4 chunks of 128 tokens of WikiText-2's validation text,
# for stories260K (tinyllamas-stories-260k-f32.v3.gguf). 4 chunks: a small file (a few KB each). Run by
# hand, never by CI (CI cannot build llama.cpp in its time budget); commit the two files it writes.
#
#   LLMQ_DATA=/path/to/datasets tests/py/gen_golden_imatrix.sh
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
DATA="${LLMQ_DATA:-$SRC/../shared/datasets}"
MODEL="$DATA/models/stories260K/tinyllamas-stories-260k-f32.v3.gguf"
TEXT="$DATA/wikitext-2-raw/wiki.valid.raw"
TOOLS="$("$SRC/bench/llama_tools.sh")"
OUT="$SRC/tests/golden"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# the dataset string is stored in both files: keep it free of machine paths
cp "$TEXT" "$WORK/wiki.valid.raw"
cd "$WORK"
for fmt in gguf dat; do
  "$TOOLS/llama-imatrix" -m "$MODEL" -f wiki.valid.raw -o "imatrix.$fmt" --output-format "$fmt" \
    --chunks 4 -c 128 -b 128 -t 2 --no-ppl >"imatrix-$fmt.log" 2>&1 || { cat "imatrix-$fmt.log" >&2; exit 1; }
done
cp imatrix.gguf "$OUT/imatrix_stories260k.gguf"
cp imatrix.dat "$OUT/imatrix_stories260k.dat"
sha256sum "$OUT/imatrix_stories260k.gguf" "$OUT/imatrix_stories260k.dat"
