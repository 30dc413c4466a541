#!/usr/bin/env bash
# Checks that the C++ and CUDA lines changed since BASE are formatted as .clang-format says, and
# prints the diff clang-format would make (docs/architecture.md, "Conventions").
#
#   scripts/check-format.sh [BASE]     BASE: a commit (default HEAD: the uncommitted changes); on a
#                                      branch, `scripts/check-format.sh main` checks the branch's changes
#
# The changed lines are those of `git diff -M BASE...` against the working tree, from the commit
# where the branch left BASE: renamed files count only their edited lines, and a line that the diff
# only moves (its text removed elsewhere in the same diff) is not a change. clang-format formats the
# statements those lines belong to (--lines). Exit 1 when it would change any, 0 otherwise.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
clang_format=${CLANG_FORMAT:-clang-format-19}
command -v "$clang_format" >/dev/null ||
  { echo "check-format: $clang_format not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
base=${1:-HEAD}
from=$(git merge-base "$base" HEAD 2>/dev/null) || { echo "check-format: $base: not a commit of this repository" >&2; exit 2; }

# The diff from BASE to the working tree, files git does not track yet included (as added whole).
patterns=('*.c' '*.cc' '*.cpp' '*.h' '*.hpp' '*.cu' '*.cuh')
diff=$(mktemp)
trap 'rm -f "$diff"' EXIT
git diff -M -U0 --no-color --no-ext-diff "$from" -- "${patterns[@]}" >"$diff"
while IFS= read -r untracked; do
  git diff --no-index -U0 --no-color --no-ext-diff /dev/null "$untracked" >>"$diff" || true
done < <(git ls-files --others --exclude-standard -- "${patterns[@]}")

# "FILE FIRST:LAST" for each run of changed lines: the diff's added lines less the moved ones.
ranges=$(awk '
  function flush() { if (first) print file, first ":" last; first = 0 }
  function text(line) { line = substr(line, 2); gsub(/^[ \t]+|[ \t]+$/, "", line); return line }
  NR == FNR { if (/^-/ && !/^--- /) removed[text($0)] = 1; next }
  /^\+\+\+ / { flush(); file = (substr($0, 5) == "/dev/null") ? "" : substr($0, 7); next }
  /^@@ / { flush(); split($3, plus, ","); line = substr(plus[1], 2); next }
  /^\+/ {
    if (file != "" && !(text($0) in removed)) {
      if (first && line == last + 1) last = line; else { flush(); first = line; last = line }
    }
    line++
  }
  END { flush() }
' "$diff" "$diff")

status=0
for file in $(printf '%s\n' "$ranges" | awk 'NF { print $1 }' | sort -u); do
  lines=()
  while read -r name range; do
    if [[ $name == "$file" ]]; then lines+=("--lines=$range"); fi
  done <<<"$ranges"
  if ! "$clang_format" --style=file "${lines[@]}" "$file" | diff -u --label "a/$file" --label "b/$file" "$file" -; then
    status=1
  fi
done
if ((status)); then
  echo "check-format: the lines above differ from .clang-format's style; apply with: $clang_format -i --style=file --lines=FIRST:LAST FILE" >&2
fi
exit "$status"
