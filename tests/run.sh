#!/usr/bin/env bash
# The llmq test command (README): set up the oracle venv, fetch the test model, build, run ctest.
#
#   ./tests/run.sh [BUILD_DIR] [extra cmake args...]
#
# BUILD_DIR defaults to build. Examples:
#   ./tests/run.sh                                      # default build (CUDA if nvcc is found)
#   ./tests/run.sh build-cpu  -DLLMQ_CUDA=OFF           # CPU-only variant
#   ./tests/run.sh build-asan -DLLMQ_CUDA=OFF -DLLMQ_SANITIZE=ON
# Environment: LLMQ_CACHE (default ~/.cache/llmq: venv + models), LLMQ_DATA (default
# ../shared/datasets), JOBS (default 2). GPU tests (label gpu) skip cleanly without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
[ $# -gt 0 ] && shift
export LLMQ_CACHE="${LLMQ_CACHE:-$HOME/.cache/llmq}"
export LLMQ_DATA="${LLMQ_DATA:-$(cd .. && pwd)/shared/datasets}"
JOBS="${JOBS:-2}"
VENV="$LLMQ_CACHE/venv"

mkdir -p "$LLMQ_CACHE"
if ! "$VENV/bin/python" -c "import numpy, gguf, safetensors, pytest" 2>/dev/null ||
   ! cmp -s tests/requirements.txt "$VENV/.llmq-requirements"; then
  echo "run.sh: setting up the oracle venv in $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/requirements.txt
  cp tests/requirements.txt "$VENV/.llmq-requirements"
fi
PYTHON="$VENV/bin/python" datasets/fetch_models.sh

cmake -S . -B "$BUILD" -DLLMQ_PYTHON="$VENV/bin/python" "$@"
cmake --build "$BUILD" -j "$JOBS"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"
