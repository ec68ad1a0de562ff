#!/usr/bin/env bash
# Prepared device call (~500 s cold): `bash research/calls/ab-warpgroup-slice-wide.sh` carrying [".whl",
# ".prebuilt/c20", ".prebuilt/c19"]. .prebuilt/c20 holds HEAD's `suite` pack cut to bf16 hdim 192/256, .prebuilt/c19
# the patch's objects of the same units (`mma-warpgroup-slice`, research/prebuild.sh with those knobs).
#   research/patches/mma-warpgroup-slice.patch at the wide head dims, where the backward's SASS moved most (step
#   loops hdim 192 626 -> 550 instructions, R2UR 108 -> 0; hdim 256 662 -> 551, R2UR 105 -> 0.6; the forward's 1-5
#   local accesses per step at hdim 256 gone; at hdim 64/128 it bought nothing on the H100, session 29): its build's
#   forward and backward GPU tests at hdim 192/256, then bench_attn against HEAD (cuDNN rows: the call's noise).
#   Predicted: backward +3-8%, forward 1.00-1.02.
set -u
source research/device_setup.sh .prebuilt/c20/*.tar.xz .prebuilt/c19/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" 192,256 bf16
AB_BUILD="FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=192,256" \
  AB_TESTS="test_fwd_gpu test_bwd_gpu" AB_TEST_TIMEOUT=110 \
  BENCH_TIMEOUT=110 BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 192,256 --seqlen 2k,8k,16k" \
  ab_patch research/patches/mma-warpgroup-slice.patch
echo "== done at ${SECONDS}s"
true
