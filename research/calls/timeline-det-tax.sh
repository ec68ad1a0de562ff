#!/usr/bin/env bash
# Prepared device call (~200 s): `bash research/calls/timeline-det-tax.sh`, carrying [".whl", ".prebuilt/c5"].
# .prebuilt/c5 holds research/prebuild.sh packs of bf16 hdim 128 compiled with
# NVCC_APPEND_FLAGS=-DFLASH_DASH_BWD_TIMELINE=1 (the store-warp and tile timelines, hopper/bwd/timeline.hpp), their
# folders renamed tl-<name> so that no other call's pack of the same name is overwritten (the source digest does not
# see the define: a timeline object links wherever the plain one would). Made with NVCC_APPEND_FLAGS set,
# FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=128: `research/prebuild.sh .prebuilt/t23`, then the patch with
# FROM=.prebuilt/t23/main FLASH_DASH_PASSES=bwd; each folder copied as tl-<name> (the slim one's `from` rewritten to
# tl-main, the objects identical to tl-main's left out) and packed into .prebuilt/c5. For HEAD (tl-main) and the
# diagnostic bwd-dq-det-nocomplete: link it, then research/bwd_timeline.py at hdim 128 2k and 8k (every det order and
# the non-det walk), into $OUT/tl-<name>.txt/.json. How long the det store warps wait for their predecessors, for the
# MMA hand-off and for their own completion, against a step: where the det path's last 1-3% (against our own
# non-det, session 23) goes. The installed build at the end is a timeline build: relink before timing.
set -u
source research/device_setup.sh .prebuilt/c5/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeline() {  # timeline NAME [PATCH]: link tl-NAME (with PATCH applied) and record
  local name=$1 patch=${2:-}
  [ -n "$patch" ] && { git apply "$patch" || return; }
  link_pack "tl-$name" "$OUT/build-$name" 128
  timeout 90 python3 research/bwd_timeline.py --hdim 128 --seqlen 2k,8k --json "$OUT/tl-$name.json" \
    > "$OUT/tl-$name.txt" 2>&1
  tail -n 17 "$OUT/tl-$name.txt" | cut -c1-160
  [ -n "$patch" ] && git apply -R "$patch"
}
timeline main
timeline bwd-dq-det-nocomplete research/patches/bwd-dq-det-nocomplete.patch
true
