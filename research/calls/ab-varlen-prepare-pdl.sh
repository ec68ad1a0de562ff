#!/usr/bin/env bash
# Prepared device call (~420 s cold), after branch `diagonal` is merged (the patch is against it):
# `bash research/calls/ab-varlen-prepare-pdl.sh` carrying [".whl", ".prebuilt/c3", ".prebuilt/c14"]. .prebuilt/c3
# holds HEAD's pack `sched-diagonal` (bf16 64/128), .prebuilt/c14 the patch's (`varlen-prepare-pdl`, full: it
# touches both passes' launches).
#   The varlen kernels as programmatic dependents of their prepare CTA (research/patches/varlen-prepare-pdl.patch):
#   its build's varlen GPU tests and racecheck of sanitize_fwd/bwd (their packs) at hdim 64 (a missing
#   wait is a race), then bench_varlen --quick against HEAD (dense rows: the call's noise).
set -u
source research/device_setup.sh .prebuilt/c3/*.tar.xz .prebuilt/c14/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack sched-diagonal "$OUT/build"
AB_TESTS="test_varlen_kernel_gpu test_varlen_gpu" \
  AB_TEST_TIMEOUT=100 AB_SANITIZE="fwd bwd" AB_SANITIZE_TOOLS=racecheck SANITIZE_HDIMS=64 SANITIZE_TIMEOUT=90 \
  BENCH_TIMEOUT=90 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 64,128 --impl dash-varlen,dash-varlen-det,dash-dense" \
  ab_patch research/patches/varlen-prepare-pdl.patch
echo "== done at ${SECONDS}s"
true
