#!/usr/bin/env bash
# On the CPU machine: compile kernel objects for a later device call, so that the call links instead of compiling.
#
#   research/prebuild.sh OUTDIR [PATCH ...]
#
# With no PATCH: `make kernels` of HEAD into OUTDIR/main. Each PATCH (a stack A.patch+B.patch as in patch_ab.sh) is
# applied to a temporary worktree of HEAD and compiled into OUTDIR/<name>, the folder patch_ab.sh's AB_PREBUILT finds.
# The knobs (FLASH_DASH_HDIMS, FLASH_DASH_DTYPES, FLASH_DASH_PASSES) select the units as for the build they stand in
# for: use the same ones as the call's AB_BUILD. Objects are stamped with their source digest (setup.py links only
# current ones). Each folder is also packed as OUTDIR/<name>.tar.xz (what travels: a call carries at most 64 MiB).
# JOBS parallel nvcc jobs (default 1).
# FROM=DIR (DIR: a HEAD build of the same knobs, e.g. OUTDIR/main; with FLASH_DASH_PASSES naming one pass): each unit
# of the other pass whose #include closure under hopper/ holds no file the patch touches compiles to the same code, so
# DIR's object is copied into the patch's folder, stamped with the patched tree's digest (the digest covers every
# header), instead of being compiled again. Then the pack leaves out every object identical to DIR's (a slim pack):
# research/device_setup.sh restores them from the unpacked DIR pack, which must travel in the same call.
set -euo pipefail
python3 -c "import cutlass_library" 2> /dev/null \
  || { echo "prebuild.sh: put a venv with nvidia-cutlass==4.2.0.0 first on PATH (the digests name its version)" >&2; exit 1; }
OUTDIR=$(realpath -m "${1:?usage: prebuild.sh OUTDIR [PATCH ...]}")
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUTDIR"
build() {  # build NAME TREE
  rm -rf "${OUTDIR:?}/$1"
  make -C "$2" -j"${JOBS:-1}" kernels BUILD="$OUTDIR/$1" > "$OUTDIR/$1.make.log" 2>&1 \
    || { tail -30 "$OUTDIR/$1.make.log"; return 1; }
}
pack() {  # pack NAME: the folder as NAME.tar.xz (with FROM: without the objects identical to FROM's)
  local o skip=()
  if [ -n "${FROM:-}" ] && [ "$1" != "$(basename "$FROM")" ]; then
    for o in "$OUTDIR/$1"/*.o; do cmp -s "$o" "$FROM/${o##*/}" && skip+=(--exclude="$1/${o##*/}"); done
    basename "$FROM" > "$OUTDIR/$1/from"  # where device_setup.sh finds the objects left out
  fi
  tar -cJf "$OUTDIR/$1.tar.xz" "${skip[@]}" --exclude='*.log' -C "$OUTDIR" "$1"
  echo "$1: $(find "$OUTDIR/$1" -name '*.o' | wc -l) objects ($((${#skip[@]})) left to $(basename "${FROM:-none}")), $(du -h "$OUTDIR/$1.tar.xz" | cut -f1) packed"
}
reaches() {  # reaches TREE UNIT PATCH...: whether UNIT's #include closure under hopper/ holds a file the patches touch
  local tree=$1 unit=$2
  shift 2
  local touched
  touched=$(for p in "$@"; do git apply --numstat "$p" | cut -f3; done)
  python3 - "$tree" "$unit" "$touched" <<'PY'
import os, re, sys
tree, unit, touched = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
seen, todo = set(), [unit]
while todo:
    f = todo.pop()
    if f in seen:
        continue
    seen.add(f)
    for inc in re.findall(r'#include "([^"]+)"', open(os.path.join(tree, f)).read()):
        for base in ("hopper", os.path.dirname(f)):
            cand = os.path.normpath(os.path.join(base, inc))
            if os.path.exists(os.path.join(tree, cand)):
                todo.append(cand)
                break
sys.exit(0 if seen & touched else 1)
PY
}
from_objects() {  # from_objects NAME TREE PATCH...: FROM's objects of the units the build skipped and the patches miss
  local name=$1 tree=$2 unit stem other
  shift 2
  other=$(case "${FLASH_DASH_PASSES:-fwd,bwd}" in fwd) echo bwd;; bwd) echo fwd;; *) echo "";; esac)
  [ -n "$other" ] || return 0
  for unit in $(cd "$tree" && FLASH_DASH_PASSES=$other python3 build_config.py sources); do
    stem=$(basename "$unit" .cu)
    if reaches "$tree" "$unit" "$@"; then
      echo "$name: $stem includes a patched file: not copied (the call compiles it)"
    elif cp "$FROM/$stem.o" "$OUTDIR/$name/"; then
      (cd "$tree" && python3 build_config.py digest "$unit") > "$OUTDIR/$name/$stem.digest"
      echo "$name: $stem from $FROM"
    fi
  done
}
if [ $# -eq 0 ]; then
  build main "$ROOT" && pack main
  exit
fi
for arg in "$@"; do
  IFS=+ read -r -a patches <<< "$arg"
  name=$(for p in "${patches[@]}"; do basename "$p" .patch; done | paste -sd+)
  tree=$(mktemp -d)/tree
  git -C "$ROOT" worktree add -q --detach "$tree" HEAD
  applied=1
  for p in "${patches[@]}"; do git -C "$tree" apply "$(realpath "$p")" || { applied=0; break; }; done
  if ((applied)); then
    if ! build "$name" "$tree"; then
      echo "$name: build failed (log: $OUTDIR/$name.make.log)"
    else
      [ -n "${FROM:-}" ] && from_objects "$name" "$tree" "${patches[@]}"
      pack "$name"
    fi
  else
    echo "$name: does not apply to HEAD"
  fi
  git -C "$ROOT" worktree remove --force "$tree"
done
