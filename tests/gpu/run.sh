#!/usr/bin/env bash
# tests/gpu/run.sh — every GPU test and GPU benchmark, in one short run on a machine with a CUDA device.
#
#   tests/gpu/run.sh
# Two ways to get the programs:
#   - .devbundle/bundle.tar.xz exists (made by tests/gpu/bundle.sh on a build machine): unpack and use
#     its prebuilt programs, libraries and data (for GPU machines without OpenBLAS/LAPACKE/jansson);
#   - otherwise build here: cmake -DLLMQ_CUDA=ON into build-gpu (needs all build dependencies).
# Then: the gpu test programs (a skip, exit 77, counts as a FAILURE here: this script is for machines
# with a device), the GPTQ speed benchmark on the CPU (all cores) and the GPU next to the numpy port,
# an end-to-end eval / quantize of stories260K on both devices, and (SKIP_8B=1 skips it) the 8B-shaped quantize
# timings of tests/gpu/scale_gpu.sh (a synthetic llama-3-8b written on the machine). Logs go to $OUT (or ./gpu-out).
# The whole run passes one device call's 10 minutes: make it two, `SKIP_8B=1 tests/gpu/run.sh` (the tests, the
# benchmark, stories260K) and `ONLY_8B=1 tests/gpu/run.sh` (the bundle unpacked again, then only the 8B shape).
# test_eval_cuda and test_calib_cuda (eval's and calib's device block paths against the CPU on SmolLM2; a few
# seconds each) read $LLMQ_EVAL_GPU_MODEL: the bundle's SmolLM2 cut to its first 4 blocks, else
# $LLMQ_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf (~/.cache/llmq).
# Exit status: 0 when every test passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_run.log"
exec > >(tee "$LOG") 2>&1
PY="${PYTHON:-python3}"
if [[ -f .devbundle/bundle.tar.xz ]]; then
  X=/tmp/llmq-bundle
  rm -rf "$X" && mkdir -p "$X" && tar -C "$X" -xJf .devbundle/bundle.tar.xz
  BIN="$X/bin"; export LLMQ_DATA="$X/data"; REF="$X/py/gptq_ref.py"
  [[ -f "$X/data/smollm2-4blk.Q4_1.gguf" ]] && export LLMQ_EVAL_GPU_MODEL="$X/data/smollm2-4blk.Q4_1.gguf"
  # cudart / cuBLAS / cuSOLVER (13.x / 12.x sonames) from the machine: its toolkit, else pip's nvidia-* wheels
  CUDALIBS=""
  for so in libcudart.so.13 libcublas.so.13 libcusolver.so.12 libcusparse.so.12 libnvJitLink.so.13; do
    d=$(find /usr/local/cuda*/ /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -name "$so" 2>/dev/null | head -1)
    [[ -n "$d" ]] && CUDALIBS="$CUDALIBS:$(dirname "$d")"
  done
  export LD_LIBRARY_PATH="$X/lib$CUDALIBS:${LD_LIBRARY_PATH:-}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
else
  cmake -S . -B build-gpu -DLLMQ_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  cmake --build build-gpu -j"$(nproc)" || exit 1
  BIN="$OUT/bin"; mkdir -p "$BIN"
  ln -sf "$PWD/build-gpu/llmq" "$PWD/build-gpu/bench/bench_gptq_speed" "$PWD/build-gpu/tests/synth_ckpt" "$BIN/"
  for f in build-gpu/tests/test_*; do ln -sf "$PWD/$f" "$BIN/"; done
  export LLMQ_DATA="${LLMQ_DATA:-$(cd .. && pwd)/shared/datasets}"; REF="$PWD/tests/py/gptq_ref.py"
fi
export LLMQ_BIN="$BIN/llmq" LLMQ_SRC="$PWD" LLMQ_BUILD="$BIN"
echo "== device"; nvidia-smi -L || true; "$BIN/llmq" devices

pass=0; fail=0; failed=""
if [[ "${ONLY_8B:-0}" != 1 ]]; then
  echo "== gpu tests"
  for t in tests/gpu/test_*.c; do
    n=$(basename "$t" .c)
    t0=$(date +%s%N)
    timeout 300 "$BIN/$n" >"$OUT/$n.log" 2>&1; rc=$?
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [[ $rc == 0 ]]; then pass=$((pass + 1)); s=PASS; else fail=$((fail + 1)); failed="$failed $n"; s="FAIL (rc $rc)"; fi
    printf '%-28s %s  %d ms\n' "$n" "$s" "$ms"
    [[ $rc == 0 ]] || tail -20 "$OUT/$n.log"
  done
  echo "gpu tests: $pass passed, $fail failed:$failed"

  if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    echo "== bench gptq_speed (group 128, CPU threads $(nproc))"
    W=$(mktemp -d)
    export OPENBLAS_NUM_THREADS=$(nproc) OMP_NUM_THREADS=$(nproc)
    for shape in 4096x4096 4096x11008; do
      R=${shape%x*}; C=${shape#*x}
      c=$("$BIN/bench_gptq_speed" --R "$R" --C "$C" --group 128 --device cpu --dump "$W/p")
      g=$("$BIN/bench_gptq_speed" --R "$R" --C "$C" --group 128 --device cuda --dump "$W/g")
      n=$(timeout 240 "$PY" "$REF" --bench "$R" "$C" --in "$W/p" --group 128 --save || echo '{"seconds": 0}')
      echo "$shape cpu $c"; echo "$shape cuda $g"; echo "$shape numpy $n"
      "$PY" - "$W" "$shape" "$c" "$g" "$n" <<'PYEOF'
import json, os, sys
import numpy as np
w, shape, c, g, n = sys.argv[1:]
c, g, n = json.loads(c), json.loads(g), json.loads(n)
def eq(a, b):
    a, b = os.path.join(w, a), os.path.join(w, b)
    return (np.fromfile(a, np.uint8) == np.fromfile(b, np.uint8)).mean() if os.path.exists(a) and os.path.exists(b) else float("nan")
print(f"{shape}: cpu {c['seconds']:.3f} s, cuda {g['seconds']:.3f} s, numpy {n['seconds']:.3f} s; "
      f"cpu/cuda {c['seconds'] / g['seconds']:.1f}x, numpy/cuda {n['seconds'] / max(g['seconds'], 1e-9):.1f}x; "
      f"codes equal cuda=cpu {eq('g.llmq.q', 'p.llmq.q'):.5f}, cpu=numpy {eq('p.llmq.q', 'p.ref.q'):.5f}")
PYEOF
      rm -f "$W"/*
    done
    rm -rf "$W"
  fi

  echo "== end to end: stories260K"
  M="$LLMQ_DATA/models/stories260K/tinyllamas-stories-260k-f32.v3.gguf"
  T="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
  # cuda: the decoder blocks on the device (eval's block path), the head's product forced onto it too (stories260K's
  # products are all under the CUDA threshold)
  for d in cpu cuda; do
    LLMQ_GEMM_CUDA_MIN_WORK=0 "$BIN/llmq" eval --model "$M" --ppl "$T" --protocol llamacpp --ctx 128 --chunks 40 --device $d 2>"$OUT/e2e_eval_$d.err" | grep -i "final" | sed "s/^/$d: /"
    grep "decoder blocks" "$OUT/e2e_eval_$d.err" | sed "s/^/$d: /"
  done
fi
if [[ "${SKIP_8B:-0}" != 1 ]]; then
  echo "== 8B shape: llmq quantize --device cuda, 128 x 2048 calibration tokens (tests/gpu/scale_gpu.sh)"
  BIN="$BIN" OUT="$OUT" bash tests/gpu/scale_gpu.sh
fi
echo "gpu tests: $pass passed, $fail failed:$failed"
[[ $fail == 0 ]]
