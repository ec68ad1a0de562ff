#!/usr/bin/env bash
# Prepared device call (one cold call): `bash research/calls/stride2-stack-and-varlen-no-fill.sh` (~450 s), or with
# SHORT=1 (~300 s: no varlen bench), carry [".whl", ".prebuilt/c1"]. .prebuilt/c1 holds research/prebuild.sh packs
# (bf16, hdim 64/128): main.tar.xz (HEAD), bwd-dq-det-complete-late+bwd-shift-stride2.tar.xz (FROM=.../main,
# FLASH_DASH_PASSES=bwd: slim; device_setup.sh restores what it left out from main) and varlen-no-fill.tar.xz.
# Link HEAD, then research/patch_ab.sh A/Bs, each variant's GPU tests on its build before its bench:
#   1. the stack bwd-dq-det-complete-late + bwd-shift-stride2 against HEAD: test_bwd_gpu; bench_attn hdim 128 (cuDNN
#      rows = the noise);
#   2. varlen-no-fill: the varlen GPU tests (its gradients come in NaN-poisoned); without SHORT, bench_varlen --quick
#      GQA at hdim 128 against the build 1 installed (whose varlen kernels differ only in the det dQ store: compare
#      the non-det rows, or rerun against a fresh HEAD link).
set -u
source research/device_setup.sh .prebuilt/c1/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
env FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128 FLASH_DASH_PREBUILT_DIR=/tmp/pb/main \
  benchmarks/gpu_session.sh $OUT/a build
cat $OUT/a/summary.txt
R=research/patches
ab() {  # ab DIR SECONDS_TOTAL PATCH [env...]: patch_ab.sh cut at SECONDS_TOTAL into the call; what ran comes back
  local dir=$1 until=$2 patch=$3
  shift 3
  timeout $((until - SECONDS)) env AB_PREBUILT=/tmp/pb "$@" research/patch_ab.sh "$OUT/$dir" "$patch"
  [ -d "$OUT/$dir/ab" ] && tar -czf "$OUT/$dir/ab.tgz" -C "$OUT/$dir" ab && rm -rf "$OUT/$dir/ab"
  echo "== $dir done at ${SECONDS}s"
}
ab k 215 "$R/bwd-dq-det-complete-late.patch+$R/bwd-shift-stride2.patch" AB_TESTS=test_bwd_gpu AB_TEST_TIMEOUT=90 \
  BENCH_TIMEOUT=60 BENCH_ARGS="--impl dash,dash-det,sdpa-cudnn --hdim 128 --seqlen 2k,8k,16k"
varlen_tests="test_integration_torch_flash_gpu test_varlen_gpu test_varlen_kernel_gpu test_packed_gpu"
if [ -n "${SHORT:-}" ]; then
  ab v 290 "$R/varlen-no-fill.patch" AB_NO_BENCH=1 AB_TESTS="$varlen_tests" AB_TEST_TIMEOUT=60
else
  ab v 450 "$R/varlen-no-fill.patch" AB_TESTS="$varlen_tests" AB_TEST_TIMEOUT=100 BENCH_TIMEOUT=70 \
    BENCH_SCRIPT=benchmarks/bench_varlen.py \
    BENCH_ARGS="--quick --hdim 128 --heads-k 4 --impl dash-varlen,dash-varlen-det,dash-dense"
fi
