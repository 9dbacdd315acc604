#!/usr/bin/env bash
# bench/bpw_sweep.sh — the size-vs-KLD curve of `llmq quantize --target-bpw X` over a range of budgets against
# llama.cpp's fixed mixes (llama-quantize's --gguf-type levels) on the same importance, judged by one
# `llmq compare` (PPL, mean KLD against the f32 base, the size-vs-KLD plot with its Pareto front).
#
#   bench/bpw_sweep.sh          # WORK=dir to resume (finished files are kept)
# Base: ~/.cache/llmq/smollm2-f32.gguf (the f32 decoding of SmolLM2-135M-Instruct.Q4_1.gguf).
# Importance: `llmq calib` over NSAMPLES x SEQLEN tokens of wiki.valid.raw (seed 0) in llama-imatrix's .dat form,
#   used by every file. Fixed mixes (MIXES): llmq's llama mix from that .dat, which is llama-quantize's file byte
#   for byte (tests/py/test_gguf_mix.py). Targets (BPWS): --target-bpw X with --mix-exclude EXCLUDE (default
#   q4_1,q5_1: the base is a decoded Q4_1 file, which those two grids rebuild almost exactly; bench/README.md
#   "gguf_choice") and --sensitivity SENS (measured: each linear's error in KLD units, on the first calibration
#   windows); the non-linear tensors (token_embd, norms) as in the --gguf-type mix of BASE_MIX.
# Judge: `llmq compare --base BASE ... --ppl wiki.test.raw --chunks CHUNKS --kld` (the base's logits once).
# Output: the compare table, then per fixed mix the target curve's KLD at the same file size (log-linear between
#   the two neighbouring targets): "below" when lower. Files: $WORK/sweep.{json,html}.
# Environment: NSAMPLES (16), SEQLEN (512), CHUNKS (10; -1 = all of wiki.test), BPWS ("4 4.5 5 5.25 5.5 5.75 6
#   6.25 6.5"), MIXES ("Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K"), BASE_MIX (Q4_K_M),
#   EXCLUDE, SENS (measured), THREADS, WORK, BUILD_DIR, LLMQ_CACHE, LLMQ_DATA.
# A budget below what the fixed tensors (token_embd in Q8_0 on SmolLM2: 28.7 MiB) allow is refused by llmq and
#   reported as such.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
NSAMPLES="${NSAMPLES:-16}"; SEQLEN="${SEQLEN:-512}"; CHUNKS="${CHUNKS:-10}"
BPWS="${BPWS:-4 4.5 5 5.25 5.5 5.75 6 6.25 6.5}"
MIXES="${MIXES:-Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K}"
BASE_MIX="${BASE_MIX:-Q4_K_M}"; EXCLUDE="${EXCLUDE:-q4_1,q5_1}"; SENS="${SENS:-measured}"
THREADS="${THREADS:-$(nproc)}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
VALID="$LLMQ_DATA/wikitext-2-raw/wiki.valid.raw"
TEST="$LLMQ_DATA/wikitext-2-raw/wiki.test.raw"
WORK="${WORK:-$(mktemp -d /tmp/llmq_bpw_sweep.XXXXXX)}"
mkdir -p "$WORK"
echo "base $BASE; imatrix wiki.valid ${NSAMPLES}x${SEQLEN}; judge llmq compare, wiki.test ctx 512 chunks $CHUNKS; work $WORK" >&2

[[ -f "$WORK/imat.dat" ]] || "$LLMQ" calib --model "$BASE" --calib "$VALID" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" \
  --seed 0 --no-xtx --threads "$THREADS" --out "$WORK/imat.lcs" --imatrix-out "$WORK/imat.dat" >"$WORK/imat.log" 2>&1
Q=("$LLMQ" quantize --model "$BASE" --format gguf --imatrix "$WORK/imat.dat" --threads "$THREADS" --no-provenance)
files=()
for m in $MIXES; do
  out="$WORK/mix-$m.gguf"
  [[ -f "$out" ]] || "${Q[@]}" --gguf-type "$m" --out "$out" >"$WORK/mix-$m.log" 2>&1
  files+=("$out")
done
for x in $BPWS; do
  out="$WORK/target-$x.gguf"
  if [[ ! -f "$out" && ! -f "$WORK/target-$x.refused" ]]; then
    s=(--sensitivity "$SENS"); [[ $SENS == measured ]] && s+=(--calib "$VALID" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --seed 0)
    if ! "${Q[@]}" --gguf-type "$BASE_MIX" --target-bpw "$x" --mix-exclude "$EXCLUDE" "${s[@]}" --out "$out" \
      --json "$WORK/target-$x.q.json" >"$WORK/target-$x.log" 2>&1; then
      cp "$WORK/target-$x.log" "$WORK/target-$x.refused"
    fi
  fi
  if [[ -f "$out" ]]; then files+=("$out"); else echo "target $x bpw: refused: $(grep -m1 -i error "$WORK/target-$x.refused")" >&2; fi
done
[[ -f "$WORK/sweep.json" ]] || "$LLMQ" compare --base "$BASE" "${files[@]}" --ppl "$TEST" --chunks "$CHUNKS" --kld \
  --threads "$THREADS" --json "$WORK/sweep.json" --html "$WORK/sweep.html" --force >"$WORK/compare.log" 2>&1
cat "$WORK/compare.log"
"$PY" - "$WORK/sweep.json" <<'PYEOF'
import json, math, sys
d = json.load(open(sys.argv[1]))
rows = [a for a in d["artifacts"] if not a["base"]]
def pt(a): return a["file_bytes"], a["kld_mean"]
mix = sorted((pt(a), a["artifact"]) for a in rows if "/mix-" in a["path"])
tgt = sorted(pt(a) for a in rows if "/target-" in a["path"])
print("\nper fixed mix: the --target-bpw curve's mean KLD at the same file size (log-linear between neighbours)")
for (size, kld), name in mix:
    lo = [p for p in tgt if p[0] <= size]; hi = [p for p in tgt if p[0] >= size]
    if not lo or not hi:
        print(f"{name:<28} {size:>11} bytes  KLD {kld:.5f}  curve: no target on both sides")
        continue
    (s0, k0), (s1, k1) = lo[-1], hi[0]
    k = k0 if s1 == s0 else math.exp(math.log(k0) + (math.log(k1) - math.log(k0)) * (size - s0) / (s1 - s0))
    print(f"{name:<28} {size:>11} bytes  KLD {kld:.5f}  curve {k:.5f}  {'below' if k < kld else 'NOT below'}"
          f" ({100 * (k / kld - 1):+.1f}%)")
PYEOF
