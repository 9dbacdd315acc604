# bench/lib.sh — the setup every bench/*.sh script shares; sourced (`. "$(dirname "$0")/lib.sh"`), never run.
#
# Sourcing it sets:
#   SRC        the repository root (the folder above bench/)
#   BUILD_DIR  $BUILD_DIR, default <repo>/build
#   CACHE      $LLMQ_CACHE, default ~/.cache/llmq (the venv, the downloaded models, smollm2-f32.gguf)
#   LLMQ_DATA  $LLMQ_DATA, default <repo>/../shared/datasets; exported, so that llmq finds dataset names there
#   PY         $LLMQ_PYTHON, default ~/.cache/llmq/venv/bin/python (gguf_speed.sh and gguf_quality.sh read
#              PYTHON instead, as llama_tools.sh does, and set PY themselves)
#   LLMQ       $BUILD_DIR/llmq
# and defines:
#   bench_build TARGET...  configure a Release build in BUILD_DIR when it has none (no CMakeCache.txt), warn on
#                          stderr when BUILD_DIR is not a Release build (the numbers would be low), then build
#                          TARGET... there (-j nproc, cmake's output discarded)
#   bench_need_llmq        exit 1 with a message unless $LLMQ is built (the scripts that only run `llmq`)
#   bench_smollm2_f32 PATH make PATH, when it does not exist, as the f32 dequantization of
#                          $CACHE/SmolLM2-135M-Instruct.Q4_1.gguf (`llmq convert --dtype f32`)
#   bench_tmpdir VAR [TEMPLATE]
#                          make a temporary directory (mktemp -d [TEMPLATE]), store its path in VAR and remove
#                          it when the script exits (an EXIT trap: one such directory per script)
#   bench_final_ppl FILE   print the PPL of the line "Final estimate: PPL = X ..." that starts a line of FILE
#                          (the summary of `llmq eval --ppl`); nothing when there is none
#   median                 print the median of the numbers on stdin, one a line
# shellcheck shell=bash disable=SC2034 # the variables are for the scripts that source this file
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$SRC/build}"
CACHE="${LLMQ_CACHE:-$HOME/.cache/llmq}"
export LLMQ_DATA="${LLMQ_DATA:-$SRC/../shared/datasets}"
PY="${LLMQ_PYTHON:-$HOME/.cache/llmq/venv/bin/python}"
LLMQ="$BUILD_DIR/llmq"

bench_build() {
  if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
    cmake -S "$SRC" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  if ! grep -q '^CMAKE_BUILD_TYPE:STRING=Release$' "$BUILD_DIR/CMakeCache.txt"; then
    echo "warning: $BUILD_DIR is not a Release build: numbers will be low" >&2
  fi
  cmake --build "$BUILD_DIR" --target "$@" -j"$(nproc)" >/dev/null
}

bench_need_llmq() {
  [[ -x "$LLMQ" ]] || { echo "error: $LLMQ not built (cmake --build $BUILD_DIR)" >&2; exit 1; }
}

bench_smollm2_f32() {
  [[ -f "$1" ]] || "$LLMQ" convert --model "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" --dtype f32 --out "$1"
}

bench_tmpdir() {
  local d
  d="$(mktemp -d ${2:+"$2"})"
  printf -v "$1" '%s' "$d"
  # shellcheck disable=SC2064 # the path is expanded now, on purpose
  trap "rm -rf $(printf %q "$d")" EXIT
}

bench_final_ppl() { sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' "$1"; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
