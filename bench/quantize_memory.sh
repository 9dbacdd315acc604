#!/usr/bin/env bash
# bench/quantize_memory.sh — peak RSS of `llmq quantize` on SmolLM2-135M against the calibration size
# (issue 4: "how it grows with --nsamples"). One run per (method, nsamples) at a fixed --seqlen, under
# GNU time; prints peak RSS, seconds, and a least-squares line RSS = a + b · tokens per method, with
# the measured points' largest deviation from it.
#
#   bench/quantize_memory.sh
# Environment: METHODS ("gptq awq"), NSAMPLES ("8 16 32 64"), SEQLEN (128), THREADS (nproc),
#   BUILD_DIR (default <repo>/build), LLMQ_CACHE, LLMQ_DATA, MAX_MEMORY (passed as --max-memory when set).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
METHODS="${METHODS:-gptq awq}"; NSAMPLES="${NSAMPLES:-8 16 32 64}"; SEQLEN="${SEQLEN:-128}"
THREADS="${THREADS:-$(nproc)}"
bench_need_llmq
BASE="$CACHE/smollm2-f32.gguf"
bench_smollm2_f32 "$BASE"
bench_tmpdir W
MM=()
[[ -n "${MAX_MEMORY:-}" ]] && MM=(--max-memory "$MAX_MEMORY")
printf '%-6s %9s %9s %12s %9s\n' method nsamples tokens peak_rss_MB seconds
for m in $METHODS; do
  pts=""
  for n in $NSAMPLES; do
    t0=$(date +%s.%N)
    /usr/bin/time -v "$LLMQ" quantize --model "$BASE" --method "$m" --bits 4 --group-size 64 --format fake \
      --calib wikitext-2-valid --nsamples "$n" --seqlen "$SEQLEN" --threads "$THREADS" "${MM[@]}" \
      --out "$W/out" --force >"$W/log" 2>&1 || { tail -5 "$W/log" >&2; exit 1; }
    s=$(echo "$(date +%s.%N) - $t0" | bc)
    kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$W/log")
    printf '%-6s %9d %9d %12.1f %9.1f\n' "$m" "$n" $((n * SEQLEN)) "$(echo "$kb / 1024" | bc -l)" "$s"
    pts="$pts $((n * SEQLEN)):$kb"
    rm -rf "$W/out"
  done
  python3 - "$m" $pts <<'PYEOF'
import sys
m, pts = sys.argv[1], [tuple(map(float, p.split(":"))) for p in sys.argv[2:]]
n = len(pts); sx = sum(x for x, _ in pts); sy = sum(y for _, y in pts)
sxx = sum(x * x for x, _ in pts); sxy = sum(x * y for x, y in pts)
b = (n * sxy - sx * sy) / (n * sxx - sx * sx) if n > 1 else 0.0
a = (sy - b * sx) / n
dev = max(abs(y - (a + b * x)) for x, y in pts) / 1024
print(f"{m}: peak RSS ≈ {a / 1024:.0f} MB + {b * 1000 / 1024:.2f} MB per 1000 calibration tokens "
      f"(largest deviation {dev:.1f} MB); at 128 x 512 = 65536 tokens: {(a + b * 65536) / 1024:.0f} MB")
PYEOF
done
