#!/usr/bin/env bash
# Prepared device call (~420 s cold): `bash research/calls/ab-two-store-warps-nondet.sh`, carrying
# [".whl", ".prebuilt/c6"] (and ".fa4x/q0" to keep FA4's first part for `research/calls/standing-fa4.sh 2` at once
# after it). .prebuilt/c6 holds research/prebuild.sh packs (bf16 hdim 64/128): HEAD's (main) and the patch's slim one
# (FROM=HEAD's).
#   bwd-dq-two-store-warps-nondet (non-det kernels run the two dQ-store warps too) against HEAD:
#   test_bwd_gpu and test_varlen_kernel_gpu on its build; racecheck and synccheck of tests/sanitize_bwd.py at
#   hdim 128 (its det kernels are HEAD's: this is also the racecheck session 23's merge did not get);
#   bench_varlen --quick hdim 128: varlen rows in both modes and the dense non-det rows (uniform full packs: the
#   non-det pack ran slower than the det one in session 23).
set -u
[ -d .fa4x/q0 ] && source research/fa4_stage.sh .fa4x/q0
source research/device_setup.sh .prebuilt/c6/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack "" "$OUT/build"  # HEAD: the pack the slim one names
timeout 470 env AB_PREBUILT=/tmp/pb AB_TESTS="test_bwd_gpu test_varlen_kernel_gpu" AB_TEST_TIMEOUT=40 \
  AB_SANITIZE=bwd SANITIZE_HDIMS=128 SANITIZE_TIMEOUT=200 BENCH_TIMEOUT=60 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 128 --impl dash-varlen,dash-varlen-det,dash-dense" \
  research/patch_ab.sh "$OUT/ab" research/patches/bwd-dq-two-store-warps-nondet.patch 2>&1 | tail -30
[ -d "$OUT/ab/ab" ] && tar -czf "$OUT/ab.tgz" -C "$OUT/ab" ab && rm -rf "$OUT/ab"
echo "== done at ${SECONDS}s"
true
