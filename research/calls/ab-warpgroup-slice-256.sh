#!/usr/bin/env bash
# Prepared device call (~450 s cold): `bash research/calls/ab-warpgroup-slice-256.sh` carrying [".whl",
# ".prebuilt/c16", ".prebuilt/c19"]. .prebuilt/c16 holds HEAD's `suite` pack cut to bf16 hdim 64/128/256,
# .prebuilt/c19 the patch's hdim 256 bf16 objects (`mma-warpgroup-slice`, from the 20-unit pack .prebuilt/c18).
#   research/patches/mma-warpgroup-slice.patch at hdim 256, where the SASS moved most (the backward step loop 662 ->
#   551 instructions, R2UR 105 -> 0.6; the forward's local accesses in its step loops 184 -> 81): its build's
#   forward and backward GPU tests at hdim 256, then bench_attn against HEAD (cuDNN rows: the call's noise).
#   Predicted: backward +3-8%, forward +1-3%.
set -u
source research/device_setup.sh .prebuilt/c16/*.tar.xz .prebuilt/c19/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" 256 bf16
AB_BUILD="FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=256" \
  AB_TESTS="test_fwd_gpu test_bwd_gpu" AB_TEST_TIMEOUT=120 \
  BENCH_TIMEOUT=120 BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 256 --seqlen 2k,8k,16k" \
  ab_patch research/patches/mma-warpgroup-slice.patch
echo "== done at ${SECONDS}s"
true
