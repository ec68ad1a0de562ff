#!/usr/bin/env bash
# Prepared device call (~300 s cold; right after ab-warpgroup-slice.sh, whose GPU tests cover the varlen kernels):
# `bash research/calls/ab-warpgroup-slice-varlen.sh` carrying [".whl", ".prebuilt/c3", ".prebuilt/c17"], the packs of
# ab-warpgroup-slice.sh.
#   research/patches/mma-warpgroup-slice.patch on packs: the varlen forward kernels' GEMMs read their stages through
#   a warp-uniform index (SASS: R2UR in the varlen step loops 54 -> 9 at hdim 128, 49 -> 12 at hdim 96; the loop's
#   instructions 1005 -> 967, now within ~10 of the dense kernel's path per step), bench_varlen --quick against HEAD
#   (the dense rows carry the patch's dense gains; cuDNN's nested-SDPA rows are the call's noise). Predicted: varlen
#   forward +1-3% at hdim 128, 1.00 at hdim 64 (its three 160-register warpgroups already read uniform stages).
set -u
source research/device_setup.sh .prebuilt/c3/*.tar.xz .prebuilt/c17/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack sched-diagonal "$OUT/build"
BENCH_TIMEOUT=120 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 64,128 --impl dash-varlen,dash-varlen-det,dash-dense,cudnn-varlen" \
  ab_patch research/patches/mma-warpgroup-slice.patch
echo "== done at ${SECONDS}s"
true
