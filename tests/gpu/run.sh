#!/usr/bin/env bash
# Builds llmq with CUDA and runs every GPU test (ctest label gpu) and GPU benchmark, for a session
# that holds a device machine. Keep it short: the whole task has minutes of device time.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -DLLMQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j "$(nproc)"
./build-gpu/llmq devices
ctest --test-dir build-gpu -L gpu --output-on-failure
# GPTQ solve, llmq CPU vs llmq CUDA vs the numpy reference (one 4096x4096 layer; python3 there has numpy)
BUILD_DIR=build-gpu LLMQ_PYTHON="${LLMQ_PYTHON:-python3}" DEVICE=cuda bench/gptq_speed.sh 4096x4096
