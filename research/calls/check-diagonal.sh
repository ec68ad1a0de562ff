#!/usr/bin/env bash
# Prepared device call (~500 s cold) for branch `diagonal`: check it out in the repo root (`git checkout diagonal`),
# write the A/B's base as an untracked patch (`git diff diagonal main -- . ':!research/calls' >
# research/calls/main-orders.patch`: main's kernels AND its launch decisions, which know no diagonal),
# then `bash research/calls/check-diagonal.sh` carrying [".whl", ".prebuilt/c12"]. .prebuilt/c12 holds
# research/prebuild.sh packs (bf16 hdim 64/128): the branch's (`sched-diagonal`, slim) and the one it names (`main`).
#   The branch (schedules split and diagonal, the varlen kernel running them, deterministic varlen auto = diagonal at
#   hdim 64 causal): test_bwd_gpu (the kernel's dQ order = the model's, every schedule), test_varlen_kernel_gpu and
#   test_varlen_gpu (each sequence's dense bits); racecheck and synccheck of tests/sanitize_bwd.py at hdim 64; then
#   bench_varlen --quick at hdim 64/128 against main (main-orders.patch linked from `main`; ratios main / branch: the
#   det varlen rows at hdim 64 causal are descending against diagonal, the rest the call's noise).
set -u
[ -f research/calls/main-orders.patch ] || { echo "research/calls/main-orders.patch missing (see the header)"; exit 1; }
source research/device_setup.sh .prebuilt/c12/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack sched-diagonal "$OUT/build"
FLASH_DASH_TEST_BUILT_ONLY=1 TESTS="test_bwd_gpu test_varlen_kernel_gpu test_varlen_gpu" TEST_TIMEOUT=100 \
  SANITIZE_PASSES=bwd SANITIZE_HDIMS=64 SANITIZE_TIMEOUT=150 benchmarks/gpu_session.sh "$OUT/check" tests sanitize \
  > /dev/null 2>&1
cat "$OUT/check/summary.txt"
ln -sfn /tmp/pb/main /tmp/pb/main-orders
timeout $((585 - SECONDS)) env AB_PREBUILT=/tmp/pb BENCH_TIMEOUT=90 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 64,128 --impl dash-varlen,dash-varlen-det,dash-dense-det-descending" \
  research/patch_ab.sh "$OUT/ab" research/calls/main-orders.patch 2>&1 | tail -34
[ -d "$OUT/ab/ab" ] && tar -czf "$OUT/ab.tgz" -C "$OUT/ab" ab && rm -rf "$OUT/ab"
echo "== done at ${SECONDS}s"
true
