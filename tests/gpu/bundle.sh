#!/usr/bin/env bash
# tests/gpu/bundle.sh — packs what tests/gpu/run.sh needs on a GPU machine that has the CUDA toolkit
# but none of llmq's other build dependencies (OpenBLAS, LAPACKE, jansson) and no network: the CUDA
# build of llmq, the gpu test programs, bench_gptq_speed and synth_ckpt (tests/gpu/scale_gpu.sh; built here), the non-system shared
# libraries they load, the numpy GPTQ port, and the small datasets the tests read (stories260K,
# wikitext-2, and SmolLM2-135M-Instruct Q4_1 cut to its first 4 blocks for test_eval_cuda and test_calib_cuda: the whole
# 98 MB file is over the limit; made with tests/py/conftest.py gguf_first_blocks when $LLMQ_CACHE has the
# file and $LLMQ_PYTHON has gguf-py). Output: .devbundle/bundle.tar.xz (git-ignored; about 45 MiB,
# under the device tool's 64 MiB transfer limit). libcudart / cuBLAS / cuSOLVER are NOT packed: the GPU machine's CUDA
# toolkit provides them (same major version as here: check `nvcc --version` on both).
#
#   tests/gpu/bundle.sh            # BUILD_DIR (default build-gpu), LLMQ_DATA (default ../shared/datasets)
set -euo pipefail
cd "$(dirname "$0")/../.."
B="${BUILD_DIR:-build-gpu}"
DATA="${LLMQ_DATA:-$(cd .. && pwd)/shared/datasets}"
cmake -S . -B "$B" -DLLMQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
GPU_TESTS=$(for f in tests/gpu/test_*.c; do basename "$f" .c; done)
cmake --build "$B" -j"${JOBS:-2}" --target llmq bench_gptq_speed synth_ckpt $GPU_TESTS >/dev/null
S="$(mktemp -d)"
trap 'rm -rf "$S"' EXIT
mkdir -p "$S/bin" "$S/lib" "$S/data/models" "$S/py"
cp "$B/llmq" "$B/bench/bench_gptq_speed" "$B/tests/synth_ckpt" "$S/bin/"
for t in $GPU_TESTS; do cp "$B/tests/$t" "$S/bin/"; done
strip "$S"/bin/* 2>/dev/null || true
# Non-system libraries, copied under their sonames (libc, libm, libgcc_s, libz, libstdc++ and the
# CUDA libraries are left to the target machine).
ldd "$B/llmq" "$S"/bin/test_* | awk '/=>/ {print $1, $3}' | sort -u | while read -r so path; do
  case "$so" in
    libc.so*|libm.so*|libgcc_s*|libz.so*|libstdc++*|libpthread*|libdl.so*|librt.so*|libcud*|libcublas*|libcusolver*|libcusparse*|libnvJitLink*) ;;
    *) cp -L "$path" "$S/lib/$so" ;;
  esac
done
cp -r "$DATA/models/stories260K" "$S/data/models/"
cp -r "$DATA/wikitext-2-raw" "$S/data/"
SMOL="${LLMQ_CACHE:-$HOME/.cache/llmq}/SmolLM2-135M-Instruct.Q4_1.gguf"
PY="${LLMQ_PYTHON:-$HOME/.cache/llmq/venv/bin/python}"
if [[ -f "$SMOL" ]] && (cd tests/py && "$PY" -c "import sys; from conftest import gguf_first_blocks as f; f(*sys.argv[1:3], 4)" \
      "$SMOL" "$S/data/smollm2-4blk.Q4_1.gguf"); then :
else echo "warning: no SmolLM2 cut in the bundle ($SMOL, $PY): test_eval_cuda and test_calib_cuda will skip" >&2; fi
cp tests/py/gptq_ref.py "$S/py/"
mkdir -p .devbundle
tar -C "$S" -cJf .devbundle/bundle.tar.xz .
ls -la .devbundle/bundle.tar.xz
