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
# FWD_FROM=DIR (with FLASH_DASH_PASSES=bwd): a patch that touches no file outside hopper/bwd/ leaves the forward objects
# as they are, so DIR's fwd objects of the selected head dims and dtypes are copied into the patch's folder, stamped
# with the patched tree's digest (the digest covers every header), instead of being compiled again.
set -euo pipefail
OUTDIR=$(realpath -m "${1:?usage: prebuild.sh OUTDIR [PATCH ...]}")
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUTDIR"
build() {  # build NAME TREE
  rm -rf "${OUTDIR:?}/$1"
  make -C "$2" -j"${JOBS:-1}" kernels BUILD="$OUTDIR/$1" > "$OUTDIR/$1.make.log" 2>&1 \
    || { tail -30 "$OUTDIR/$1.make.log"; return 1; }
}
pack() {  # pack NAME: the folder as NAME.tar.xz
  tar -cJf "$OUTDIR/$1.tar.xz" -C "$OUTDIR" "$1"
  echo "$1: $(find "$OUTDIR/$1" -name '*.o' | wc -l) objects, $(du -h "$OUTDIR/$1.tar.xz" | cut -f1) packed"
}
bwd_only() {  # bwd_only PATCH...: whether the patches touch nothing outside hopper/bwd/ (the forward's objects stay)
  local p
  for p in "$@"; do
    git apply --numstat "$p" | cut -f3 | grep -qv '^hopper/bwd/' && return 1
  done
  return 0
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
      if [ -n "${FWD_FROM:-}" ] && ! bwd_only "${patches[@]}"; then
        echo "$name: FWD_FROM ignored (the patch touches files outside hopper/bwd/)"
      elif [ -n "${FWD_FROM:-}" ]; then
        for unit in $(cd "$tree" && FLASH_DASH_PASSES=fwd python3 build_config.py sources); do
          stem=$(basename "$unit" .cu)
          cp "$FWD_FROM/$stem.o" "$OUTDIR/$name/" || { echo "$name: no $stem.o in $FWD_FROM"; continue; }
          (cd "$tree" && python3 build_config.py digest "$unit") > "$OUTDIR/$name/$stem.digest"
        done
        echo "$name: forward objects from $FWD_FROM"
      fi
      pack "$name"
    fi
  else
    echo "$name: does not apply to HEAD"
  fi
  git -C "$ROOT" worktree remove --force "$tree"
done
