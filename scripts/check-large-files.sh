#!/usr/bin/env bash
# Fails if a file git tracks, or would add (untracked and not ignored), is
# larger than 1 MB and is not generated code. A committed build output (a
# binary, a profile, a database dump) makes every clone heavier for good;
# build outputs belong in .gitignore. Generated code is recognised by the
# standard header (go.dev/s/generatedcode):
#   // Code generated ... DO NOT EDIT.
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-1048576}
status=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue # deleted in the working tree
  size=$(stat -c %s -- "$f")
  [ "$size" -gt "$limit" ] || continue
  if head -c 4096 -- "$f" | grep -aqE '^// Code generated .* DO NOT EDIT\.$'; then
    continue
  fi
  echo "$f: $size bytes, over $limit and not generated code; delete it or add it to .gitignore" >&2
  status=1
done < <(git ls-files -z --cached --others --exclude-standard)
exit $status
