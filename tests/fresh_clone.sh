#!/usr/bin/env bash
# The README's main job, as a new user runs it: a git clone of this checkout's HEAD (committed state
# only) in a temporary directory with no ../shared beside it, a fresh LLMQ_CACHE, no LLMQ_DATA, no
# LLMQ_MANIFEST, and the command between the README's `main-job-command` markers run verbatim.
# Checks that it succeeds, that its last lines are the base's and the quantized model's perplexity and
# the difference, that the texts came from the clone's datasets/data, and that `cmake --install`'s
# prefix serves the data with the clone's datasets/ gone. Also checks that no README command writes a
# path under ~/.cache or $HOME/.cache that LLMQ_CACHE should decide.
#
#   tests/fresh_clone.sh            # ctest: fresh_clone (label fresh); exit 77 (skipped) with
#                                   # LLMQ_ORACLES=light (CI's CUDA and ASan variants) or without git
#
# Honest shortcut: the model download is not part of the test. The fresh cache is pre-seeded with a
# hard link (or copy) of SmolLM2-135M-Instruct.Q4_1.gguf from the real cache ($LLMQ_SEED_CACHE,
# default $LLMQ_CACHE or ~/.cache/llmq), so CI needs no network; fetch_models.sh still runs and
# verifies its sha256. Without that file the script downloads it like a user would (needs network).
# Environment: JOBS (build parallelism, default 2), KEEP=1 keeps the temporary directory.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
SEED="${LLMQ_SEED_CACHE:-${LLMQ_CACHE:-$HOME/.cache/llmq}}"
JOBS="${JOBS:-2}"
T="$(cd "$(mktemp -d "${TMPDIR:-/tmp}/llmq-fresh.XXXXXX")" && pwd -P)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$T"' EXIT
fail() { echo "fresh_clone: FAIL: $*" >&2; exit 1; }
if [ "${LLMQ_ORACLES:-}" = light ]; then echo "fresh_clone: skipped (LLMQ_ORACLES=light)"; exit 77; fi
if ! git -C "$SRC" rev-parse --verify -q HEAD >/dev/null; then echo "fresh_clone: skipped ($SRC is not a git checkout)"; exit 77; fi

# 1. a clone of HEAD, with nothing beside it
git clone -q --no-hardlinks "$SRC" "$T/llmq"
git -C "$T/llmq" checkout -q --detach "$(git -C "$SRC" rev-parse HEAD)"
[ ! -e "$T/shared" ] || fail "$T/shared exists"

# 2. README: no ~/.cache or $HOME/.cache in its commands (the indented code lines) other than as the
#    default of ${LLMQ_CACHE:-...}
bad=$(grep -nE '^    ' "$T/llmq/README.md" | sed 's/\${LLMQ_CACHE:-\$HOME\/\.cache\/llmq}//g' |
      grep -E '~/\.cache|\$HOME/\.cache|\$\{HOME\}/\.cache' || true)
[ -z "$bad" ] || fail "README commands with a hard-coded cache path (use \$LLMQ_CACHE):"$'\n'"$bad"

# 3. the main-job command, verbatim from the committed README
cmd=$(awk '/^<!-- main-job-command/{f=1; next} /^<!-- \/main-job-command/{f=0} f && /^    /{sub(/^    /, ""); print}' \
      "$T/llmq/README.md")
[ -n "$cmd" ] && [ "$(printf '%s\n' "$cmd" | wc -l)" -eq 1 ] || fail "no single command between the README's main-job-command markers"
case "$cmd" in *"-j2"*) ;; *) fail "the README's command does not build with -j2: $cmd" ;; esac
[ "$JOBS" = 2 ] || cmd="${cmd//-j2/-j$JOBS}"

export LLMQ_CACHE="$T/cache"
unset LLMQ_DATA LLMQ_MANIFEST
mkdir -p "$LLMQ_CACHE"
if [ -f "$SEED/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
  ln "$SEED/SmolLM2-135M-Instruct.Q4_1.gguf" "$LLMQ_CACHE/" 2>/dev/null ||
    cp "$SEED/SmolLM2-135M-Instruct.Q4_1.gguf" "$LLMQ_CACHE/"
  echo "fresh_clone: pre-seeded $LLMQ_CACHE with SmolLM2 from $SEED (no download)"
fi
echo "fresh_clone: in $T/llmq: $cmd"
start=$(date +%s)
(cd "$T/llmq" && bash -c "$cmd") >"$T/out.txt" 2>"$T/err.txt" || {
  tail -n 30 "$T/err.txt" >&2
  fail "the README's main-job command exited non-zero"
}
echo "fresh_clone: the command took $(( $(date +%s) - start )) s"
tail -n 3 "$T/out.txt"

# 4. it ends with the base's figure, the quantized one and the difference
last=$(tail -n 3 "$T/out.txt")
num='[0-9]+\.[0-9]+ \+/- [0-9]+\.[0-9]+'
printf '%s\n' "$last" | sed -n 1p | grep -qE "^base: +PPL = $num" || fail "the third-last line is not the base's PPL"
printf '%s\n' "$last" | sed -n 2p | grep -qE "^quantized: +PPL = $num" || fail "the second-last line is not the quantized PPL"
printf '%s\n' "$last" | sed -n 3p | grep -qE "^difference: +PPL [+-]$num +\([+-][0-9.]+% " || fail "the last line is not the difference"
# the texts were the clone's own (nothing else was there to find)
grep -q "calib: wikitext-2-valid: $T/llmq/datasets/data/wikitext-2-valid.raw.gz" "$T/err.txt" ||
  fail "the calibration text did not come from the clone's datasets/data"
grep -q "^text: .*$T/llmq/datasets/data/wikitext-2-test.raw.gz" "$T/out.txt" ||
  fail "the perplexity text did not come from the clone's datasets/data"

# 5. an install prefix serves the data on its own (the clone's datasets/ moved away)
cmake --install "$T/llmq/build" --prefix "$T/prefix" >/dev/null
mv "$T/llmq/datasets" "$T/llmq/datasets.away"
(cd "$T" && ./prefix/bin/llmq eval --model "$LLMQ_CACHE/smollm2-f32.gguf" --ppl wikitext-2 --ctx 128 --chunks 1 \
  --threads "$JOBS") >"$T/inst.txt" 2>"$T/inst.err" || { cat "$T/inst.err" >&2; fail "the installed llmq did not run"; }
grep -q "^text: .*$T/prefix/share/llmq/data/wikitext-2-test.raw.gz" "$T/inst.txt" ||
  fail "the installed llmq did not read the installed data: $(grep '^text:' "$T/inst.txt")"
echo "fresh_clone: ok"
