#!/usr/bin/env bash
# Builds llmq with CUDA and runs every GPU test (ctest label gpu) and GPU benchmark, for a session
# that holds a device machine. Keep it short: the whole task has minutes of device time.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -DLLMQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-gpu -j "$(nproc)"
./build-gpu/llmq devices
ctest --test-dir build-gpu -L gpu --output-on-failure
