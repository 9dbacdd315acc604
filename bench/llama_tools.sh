#!/usr/bin/env bash
# bench/llama_tools.sh — build llama.cpp's own command-line tools (llama-imatrix, llama-quantize,
# llama-perplexity) once, from the llama.cpp sources vendored in the llama-cpp-python 0.3.36 sdist (the
# same llama.cpp the Python oracle runs), into $LLMQ_CACHE/llama-tools-0.3.36/bin. Prints that directory.
# Benchmarks only (bench/gguf_quality.sh needs llama-imatrix for llama.cpp's own importance matrix);
# the test suite never needs these. Takes ~10 min on 2 cores the first time; later calls return at once.
set -euo pipefail
CACHE="${LLMQ_CACHE:-$HOME/.cache/llmq}"
VER=0.3.36
DEST="$CACHE/llama-tools-$VER"
TOOLS="llama-imatrix llama-quantize llama-perplexity"
have=1
for t in $TOOLS; do [[ -x "$DEST/bin/$t" ]] || have=0; done
if [[ $have == 1 ]]; then echo "$DEST/bin"; exit 0; fi
PY="${PYTHON:-$CACHE/venv/bin/python}"
mkdir -p "$CACHE/sdist" "$DEST"
sd="$CACHE/sdist/llama_cpp_python-$VER.tar.gz"
if [[ ! -f "$sd" ]]; then
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VER" -d "$CACHE/sdist" >&2
fi
src="$DEST/src"
if [[ ! -d "$src/llama_cpp_python-$VER" ]]; then
  mkdir -p "$src" && tar -xzf "$sd" -C "$src"
fi
lc="$src/llama_cpp_python-$VER/vendor/llama.cpp"
cmake -S "$lc" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$DEST/build" -j"${JOBS:-2}" --target $TOOLS >&2
mkdir -p "$DEST/bin"
for t in $TOOLS; do cp "$DEST/build/bin/$t" "$DEST/bin/"; done
echo "$DEST/bin"
