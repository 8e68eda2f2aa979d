#!/usr/bin/env bash
# Fails when a file under src/ includes a header of a layer its own layer may not use: the
# "may use" column of docs/ARCHITECTURE.md's layer table, kept here as data. Direct includes
# only (`#include "layer/..."`); a layer may always include its own headers.
#
#   scripts/check_layers.sh [ROOT]   checks ROOT/src (default: this checkout); prints each
#                                    violation (file:line: include) and exits 1 if any
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# layer (a folder under src/) -> the layers it may include. src/cm/librdmacm is a layer of its own.
declare -A may_use=(
  [base]=""
  [wire]="base"
  [capture]="base"
  [net]="base wire"
  [gsi]="base wire net"
  [provider]="base wire"
  [engine]="base wire net provider"
  [daemon]="base wire net gsi"
  [runtime]="base wire net provider engine daemon"
  [cm]="base wire net provider daemon"
  [verbs]="base net provider daemon runtime"
  [cm/librdmacm]="base wire net gsi provider daemon runtime verbs cm"
)

layer_of() {  # src/<layer>/... -> layer
  case $1 in
    src/cm/librdmacm/*) echo cm/librdmacm ;;
    *) local rest=${1#src/}; echo "${rest%%/*}" ;;
  esac
}

violations=0
while IFS= read -r file; do
  layer=$(layer_of "$file")
  if [ -z "${may_use[$layer]+set}" ]; then
    echo "$file: layer '$layer' is not in scripts/check_layers.sh's table" >&2
    violations=$((violations + 1))
    continue
  fi
  while IFS=: read -r line include; do
    target=${include#*\"}
    target=${target%%\"*}
    case $target in
      cm/librdmacm/*) dep=cm/librdmacm ;;
      */*) dep=${target%%/*} ;;
      *) continue ;;  # a header beside the file
    esac
    [ -n "${may_use[$dep]+set}" ] || continue  # not one of src/'s layers (tools/, a system header)
    [ "$dep" = "$layer" ] && continue
    case " ${may_use[$layer]} " in
      *" $dep "*) ;;
      *)
        echo "$file:$line: $layer may not include $target" >&2
        violations=$((violations + 1))
        ;;
    esac
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
done < <(find src -name '*.h' -o -name '*.cc' | sort)

if [ "$violations" -ne 0 ]; then
  echo "check_layers: $violations include(s) cross a layer boundary (docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "check_layers: every include under src/ follows the layer table"
