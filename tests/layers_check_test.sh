#!/usr/bin/env bash
# ctest layers.catches_an_upward_include: scripts/check_layers.sh must fail on a copy of src/
# where wire/ includes engine/, and pass on the unchanged copy (so a checker that never fails,
# or always fails, is caught).
set -euo pipefail
src_root=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$src_root/src" "$tmp/src"
"$src_root/scripts/check_layers.sh" "$tmp" > /dev/null
printf '#include "engine/engine.h"\n' >> "$tmp/src/wire/psn.h"
if "$src_root/scripts/check_layers.sh" "$tmp" 2> "$tmp/err"; then
  echo "check_layers.sh passed a wire/ -> engine/ include" >&2
  exit 1
fi
grep -q 'wire may not include engine/engine.h' "$tmp/err"
echo "check_layers.sh caught the planted include"
