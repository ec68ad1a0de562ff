#!/usr/bin/env bash
# Prepared device call (~480 s cold): `bash research/calls/check-turn-mbarrier.sh`, carrying
# [".whl", ".prebuilt/c9"]. .prebuilt/c9 holds research/prebuild.sh packs (bf16 hdim 64/128): HEAD's (`turn`, slim)
# and the one it names (`main`: the tree before HEAD's dQ-store turn barriers, session 23's merge).
#   HEAD (the store warps' turn as an mbarrier per warp instead of a shared-memory word, which racecheck reported as
#   54 hazards at hdim 128; two store warps in non-det kernels too): test_bwd_gpu and test_varlen_kernel_gpu;
#   racecheck and synccheck of tests/sanitize_bwd.py at hdim 64 and 128; then bench_attn dash/dash-det/cuDNN hdim
#   64/128 2k/8k against the tree before (research/calls/before-turn-mbarrier.patch, untracked: `git diff HEAD
#   HEAD~1 -- hopper`, linked from `main`; the ratios are before / HEAD, cuDNN's the call's noise).
set -u
source research/device_setup.sh .prebuilt/c9/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack turn "$OUT/build"
FLASH_DASH_TEST_BUILT_ONLY=1 TESTS="test_bwd_gpu test_varlen_kernel_gpu" TEST_TIMEOUT=60 SANITIZE_PASSES=bwd \
  SANITIZE_HDIMS=64,128 SANITIZE_TIMEOUT=200 benchmarks/gpu_session.sh "$OUT/check" tests sanitize > /dev/null 2>&1
cat "$OUT/check/summary.txt"
ln -sfn /tmp/pb/main /tmp/pb/before-turn-mbarrier
timeout $((585 - SECONDS)) env AB_PREBUILT=/tmp/pb BENCH_TIMEOUT=60 \
  BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 64,128 --seqlen 2k,8k" \
  research/patch_ab.sh "$OUT/ab" research/calls/before-turn-mbarrier.patch 2>&1 | tail -14
[ -d "$OUT/ab/ab" ] && tar -czf "$OUT/ab.tgz" -C "$OUT/ab" ab && rm -rf "$OUT/ab"
echo "== done at ${SECONDS}s"
true
