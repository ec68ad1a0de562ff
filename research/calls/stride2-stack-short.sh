#!/usr/bin/env bash
# Prepared device call (one cold call, ~300 s): `bash research/calls/stride2-stack-short.sh`, carry [".whl", ".prebuilt/c1"].
# .prebuilt/c1 holds research/prebuild.sh packs (bf16, hdim 64/128): main.tar.xz (HEAD), varlen-no-fill.tar.xz and
# bwd-dq-det-complete-late+bwd-shift-stride2.tar.xz (FROM=.../main, FLASH_DASH_PASSES=bwd: slim); the objects a slim pack left out come
# from main (device_setup.sh).
# Link HEAD (bf16 64/128); A/B of the stack bwd-dq-det-complete-late + bwd-shift-stride2 (test_bwd_gpu; bench hdim 128, cuDNN rows = the noise);
# then varlen-no-fill's varlen GPU tests on its build (no bench).
set -u
P=.prebuilt/c1
source research/device_setup.sh $P/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
env FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128 FLASH_DASH_PREBUILT_DIR=/tmp/pb/main \
  benchmarks/gpu_session.sh $OUT/a build
cat $OUT/a/summary.txt
R=research/patches
timeout $((215 - SECONDS)) env AB_PREBUILT=/tmp/pb AB_TESTS="test_bwd_gpu" AB_TEST_TIMEOUT=90 BENCH_TIMEOUT=60 \
  BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 128 --seqlen 2k,8k,16k" \
  research/patch_ab.sh $OUT/k $R/bwd-dq-det-complete-late.patch+$R/bwd-shift-stride2.patch
[ -d $OUT/k/ab ] && tar -czf $OUT/k/ab.tgz -C $OUT/k ab && rm -rf $OUT/k/ab
echo "== kernel A/B done at ${SECONDS}s"
timeout $((300 - SECONDS)) env AB_PREBUILT=/tmp/pb AB_NO_BENCH=1 AB_TEST_TIMEOUT=60 \
  AB_TESTS="test_integration_torch_flash_gpu test_varlen_gpu test_varlen_kernel_gpu" \
  research/patch_ab.sh $OUT/v $R/varlen-no-fill.patch
[ -d $OUT/v/ab ] && tar -czf $OUT/v/ab.tgz -C $OUT/v ab && rm -rf $OUT/v/ab
echo "== call done in ${SECONDS}s"
