#!/usr/bin/env bash
# The format check of CI (.ci/run): every tracked C / CUDA source and header must be formatted as
# .clang-format says (clang-format --dry-run -Werror). The generated Unicode table is exempt.
#   tests/check_format.sh            check (exit 1 naming the files that differ)
#   tests/check_format.sh --fix      rewrite them in place
set -euo pipefail
cd "$(dirname "$0")/.."
CF="${CLANG_FORMAT:-clang-format}"
if ! command -v "$CF" >/dev/null; then
  echo "check_format: $CF not found (Debian: apt-get install clang-format)" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' | grep -v '^calib/tokenizer/unicode_data\.c$')
if [ "${1:-}" = --fix ]; then
  "$CF" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$CF" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: %d file(s) differ from .clang-format (%s --version: %s); run tests/check_format.sh --fix:\n' \
    "${#bad[@]}" "$CF" "$("$CF" --version | head -n 1)" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format says"
