#!/usr/bin/env bash
# Prepared device call (~450 s cold): `bash research/calls/ab-warpgroup-slice.sh` carrying [".whl", ".prebuilt/c3",
# ".prebuilt/c17"]. .prebuilt/c3 holds HEAD's pack `sched-diagonal` (bf16 64/128), .prebuilt/c17 the patch's
# (`mma-warpgroup-slice`, bf16 64/128, both passes).
#   research/patches/mma-warpgroup-slice.patch: the MMA warpgroups partition their smem operands through a slice at
#   the warpgroup's first thread with a warp-uniform index, so GMMA descriptors stay in uniform registers (SASS on
#   the CPU machine: the hdim 128 backward step loop 581 -> 533 static instructions, R2UR 49 -> 0-1; the dense
#   forward's 832 -> 815, R2UR 20 -> 4; the varlen forward's, whose stages are broadcast too, 1005 -> 967, R2UR 54 ->
#   9). Its build's dense and varlen GPU tests, synccheck of sanitize_bwd at hdim 128, then bench_attn against HEAD
#   (cuDNN rows: the call's noise); the varlen bench follows in ab-warpgroup-slice-varlen.sh.
set -u
source research/device_setup.sh .prebuilt/c3/*.tar.xz .prebuilt/c17/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack sched-diagonal "$OUT/build"
AB_TESTS="test_fwd_gpu test_bwd_gpu test_varlen_kernel_gpu" \
  AB_TEST_TIMEOUT=100 AB_SANITIZE="bwd" AB_SANITIZE_TOOLS=synccheck SANITIZE_HDIMS=128 SANITIZE_TIMEOUT=90 \
  BENCH_TIMEOUT=110 BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 64,128 --seqlen 2k,8k,16k" \
  ab_patch research/patches/mma-warpgroup-slice.patch
echo "== done at ${SECONDS}s"
true
