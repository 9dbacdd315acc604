#!/usr/bin/env bash
# The llmq test command (README): set up the oracle venv, fetch the test model, build, run ctest.
#
#   ./tests/run.sh [BUILD_DIR] [extra cmake args...]
#
# BUILD_DIR defaults to build. Examples:
#   ./tests/run.sh                                      # default build (CUDA if nvcc is found)
#   ./tests/run.sh build-cpu  -DLLMQ_CUDA=OFF           # CPU-only variant
#   ./tests/run.sh build-asan -DLLMQ_CUDA=OFF -DLLMQ_SANITIZE=ON
# First run: about 50 minutes on 2 cores, about 35 of them building the llama-cpp-python wheel (once;
# cached in $LLMQ_CACHE/wheels). LLMQ_WITH_LLAMA_CPP=0 skips that build and the llama.cpp-backed
# oracles (reported as skipped); LLMQ_WITH_HF=1 adds the transformers oracle; LLMQ_ORACLES=light
# skips the heavy oracles and the fresh-clone run of the README's main job (tests/fresh_clone.sh).
# Environment: LLMQ_CACHE (default ~/.cache/llmq: venv, wheels, models), LLMQ_DATA (default
# ../shared/datasets: the test models and upstream-layout reference texts; the product's own texts
# ship in datasets/data), JOBS (default 2), LLMQ_WITH_LLAMA_CPP (default 1), LLMQ_WITH_HF (default 0),
# LLMQ_CTEST_ARGS (extra ctest arguments, e.g. -R REGEX for a subset).
# GPU tests (label gpu) skip cleanly without a device.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
[ $# -gt 0 ] && shift
export LLMQ_CACHE="${LLMQ_CACHE:-$HOME/.cache/llmq}"
export LLMQ_DATA="${LLMQ_DATA:-$(cd .. && pwd)/shared/datasets}"
[ -d "$LLMQ_DATA/models/stories260K" ] ||
  echo "run.sh: warning: $LLMQ_DATA/models/stories260K is missing: the tests that read the stories260K test model fail (set LLMQ_DATA)" >&2
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
# llama.cpp itself (llama-cpp-python) is the oracle for tokenization, logits and perplexity. PyPI has
# only its source: the wheel is built once (about 35 minutes on 2 cores) and cached in $LLMQ_CACHE/wheels.
# LLMQ_WITH_LLAMA_CPP=0 skips it; the tests that need it then report "skipped" and the committed
# goldens (tests/golden, made from llama.cpp by tests/py/gen_golden_*.py) still run.
LCP_VERSION=0.3.36
if [ "${LLMQ_WITH_LLAMA_CPP:-1}" = 1 ] && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
  mkdir -p "$LLMQ_CACHE/wheels"
  whl=$(ls "$LLMQ_CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$whl" ]; then
    echo "run.sh: building the llama-cpp-python $LCP_VERSION wheel once into $LLMQ_CACHE/wheels (about 35 minutes on 2 cores; LLMQ_WITH_LLAMA_CPP=0 skips it)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
      "$VENV/bin/pip" wheel --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$LCP_VERSION" -w "$LLMQ_CACHE/wheels"
    whl=$(ls "$LLMQ_CACHE"/wheels/llama_cpp_python-$LCP_VERSION-*.whl | head -n 1)
  fi
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/requirements-llamacpp.txt
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "$whl"
fi
# Hugging Face transformers + GPTQModel (tests/requirements-hf.txt) for tests/py/test_hf_load.py: with
# LLMQ_WITH_HF=1 its venv is set up (once; ~3.5 GB download) and LLMQ_HF_PYTHON names it; without, that
# test reports "skipped".
if [ "${LLMQ_WITH_HF:-0}" = 1 ]; then
  HF_VENV="$LLMQ_CACHE/venv-hf"
  if ! cmp -s tests/requirements-hf.txt "$HF_VENV/.llmq-requirements"; then
    echo "run.sh: setting up the transformers venv in $HF_VENV (torch, transformers, gptqmodel; minutes)"
    python3 -m venv "$HF_VENV"
    "$HF_VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/requirements-hf.txt
    cp tests/requirements-hf.txt "$HF_VENV/.llmq-requirements"
  fi
  export LLMQ_HF_PYTHON="$HF_VENV/bin/python"
fi
PYTHON="$VENV/bin/python" datasets/fetch_models.sh

cmake -S . -B "$BUILD" -DLLMQ_PYTHON="$VENV/bin/python" "$@"
cmake --build "$BUILD" -j "$JOBS"
# LLMQ_CTEST_ARGS: extra ctest arguments (split on spaces), e.g. "-R ^test_" to run a subset.
read -ra ctest_extra <<<"${LLMQ_CTEST_ARGS:-}"
ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS" "${ctest_extra[@]}"
