#!/usr/bin/env bash
# The oracles whose figures depend on float32 summation order, i.e. on which OpenBLAS kernels run,
# once per OpenBLAS kernel family (OPENBLAS_CORETYPE) that this CPU can execute: an old one every
# x86-64 CPU runs (Sandybridge with AVX, else Nehalem or Prescott), Haswell (AVX2 + FMA), and the
# AVX-512 one (Cooperlake with AVX512-BF16, else SkylakeX) where the CPU has it. A family the CPU
# lacks is never forced. The normal suite run keeps OPENBLAS_CORETYPE as the environment has it, and
# the family it ran is not run twice (see below).
#
#   tests/blas_kernels.sh BUILD_DIR      (a configured and built tree, e.g. .ci/run's build-ci-cpu)
set -euo pipefail
BUILD="${1:?usage: tests/blas_kernels.sh BUILD_DIR}"
TESTS='^(py_test_(awq_oracle|gptq_oracle|emulate_oracle)|test_(gemm_cpu|forward|gptq_gguf))$'
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }

# The suite itself ran with the kernels OpenBLAS picks (llmq --version names them): that family is not run
# again, and when it is an old one every x86-64 CPU runs (an OpenBLAS that does not know the CPU falls back
# to Prescott), it stands for the old family.
own=$("$BUILD/llmq" --version | sed -n 's/.*kernels in use: \([A-Za-z0-9_]*\).*/\1/p')
echo "== the suite ran with OpenBLAS kernels ${own:-unknown} (OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset})"
families=()
case "${own,,}" in
  prescott | core2 | penryn | dunnington | nehalem | sandybridge) ;;
  *) if has avx; then families+=(Sandybridge); elif has sse4_2; then families+=(Nehalem); else families+=(Prescott); fi ;;
esac
if has avx2 fma; then families+=(Haswell); fi
if has avx512f avx512bw avx512vl avx512dq avx512cd; then
  if has avx512_bf16; then families+=(Cooperlake); else families+=(SkylakeX); fi
fi
for fam in "${families[@]}"; do
  if [[ "${fam,,}" == "${own,,}" ]]; then echo "== OPENBLAS_CORETYPE=$fam: the suite ran it already"; continue; fi
  echo "== OpenBLAS kernels OPENBLAS_CORETYPE=$fam: the numerics-sensitive oracles"
  t0=$(date +%s)
  OPENBLAS_CORETYPE="$fam" ctest --test-dir "$BUILD" --output-on-failure -j "${JOBS:-2}" -R "$TESTS"
  echo "== OPENBLAS_CORETYPE=$fam passed in $(( $(date +%s) - t0 )) s"
done
