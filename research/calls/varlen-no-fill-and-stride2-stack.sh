#!/usr/bin/env bash
# Prepared device call (one cold call, ~450 s): `bash research/calls/varlen-no-fill-and-stride2-stack.sh`, carry [".whl", ".prebuilt/c1"].
# .prebuilt/c1 holds research/prebuild.sh packs (bf16, hdim 64/128): main.tar.xz (HEAD), varlen-no-fill.tar.xz and
# bwd-dq-det-complete-late+bwd-shift-stride2.tar.xz (FROM=.../main, FLASH_DASH_PASSES=bwd: slim); the objects a slim pack left out come
# from main (device_setup.sh).
# Link HEAD (bf16 64/128), then A/B, each variant's GPU tests on its build, then its bench beside the installed one:
#   1. varlen-no-fill against HEAD: the varlen GPU tests (gradients come in NaN-poisoned), bench_varlen --quick GQA;
#   2. the stack bwd-dq-det-complete-late + bwd-shift-stride2 (test_bwd_gpu) against the build 1 installed
#      (its dense kernels are HEAD's: varlen-no-fill changes the varlen prepare step only); cuDNN rows = the noise;
set -u
P=.prebuilt/c1
source research/device_setup.sh $P/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
env FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128 FLASH_DASH_PREBUILT_DIR=/tmp/pb/main \
  benchmarks/gpu_session.sh $OUT/a build
cat $OUT/a/summary.txt
R=research/patches
timeout 200 env AB_PREBUILT=/tmp/pb AB_TEST_TIMEOUT=100 BENCH_TIMEOUT=70 \
  AB_TESTS="test_varlen_kernel_gpu test_packed_gpu test_integration_torch_flash_gpu test_varlen_gpu" \
  BENCH_SCRIPT=benchmarks/bench_varlen.py BENCH_ARGS="--quick --hdim 128 --heads-k 4 --impl dash-varlen,dash-varlen-det,dash-dense" \
  research/patch_ab.sh $OUT/v $R/varlen-no-fill.patch
[ -d $OUT/v/ab ] && tar -czf $OUT/v/ab.tgz -C $OUT/v ab && rm -rf $OUT/v/ab
echo "== varlen A/B done at ${SECONDS}s"
left=$((455 - SECONDS))
timeout $left env AB_PREBUILT=/tmp/pb AB_TESTS="test_bwd_gpu" AB_TEST_TIMEOUT=90 BENCH_TIMEOUT=90 \
  BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 128 --seqlen 2k,8k,16k" \
  research/patch_ab.sh $OUT/k $R/bwd-dq-det-complete-late.patch+$R/bwd-shift-stride2.patch
[ -d $OUT/k/ab ] && tar -czf $OUT/k/ab.tgz -C $OUT/k ab && rm -rf $OUT/k/ab
echo "== call1 done in ${SECONDS}s"
