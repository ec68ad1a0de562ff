#!/usr/bin/env bash
# Prepared device call (~210 s cold): `bash research/calls/ab-varlen-stage-broadcast.sh` carrying [".whl",
# ".prebuilt/c3", ".prebuilt/c21"]. .prebuilt/c3 holds HEAD's pack `sched-diagonal` (bf16 64/128), .prebuilt/c21 the
# patch's forward objects (`varlen-stage-broadcast`, slim: its backward objects are c3's).
#   research/patches/varlen-stage-broadcast.patch: the part of mma-warpgroup-slice.patch that session 29 measured
#   ahead (varlen forward hdim 128 +2.0-2.9%) without the warpgroup slice that cost hdim 64 2-6% (H100, session 29):
#   the varlen two-warpgroup forward reads its K/V/Q stages through an index broadcast from lane 0. SASS (CPU
#   machine), bf16 hdim 128 varlen step loops: 1007 -> 983 instructions, R2UR 54 -> 24 (the dense kernel's 20).
#   The call: bench_varlen --quick at hdim 128 against HEAD (the dense rows, the same code in both builds, are the
#   call's noise); no tests, to fit a cold call in 300 s of device time: the merge's call runs the varlen GPU
#   tests. Predicted: varlen forward +1-2.5% at hdim 128, backward and dense 1.00 +- 0.01.
set -u
source research/device_setup.sh .prebuilt/c3/*.tar.xz .prebuilt/c21/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack sched-diagonal "$OUT/build"
BENCH_TIMEOUT=100 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 128 --impl dash-varlen,dash-varlen-det,dash-dense" \
  ab_patch research/patches/varlen-stage-broadcast.patch
echo "== done at ${SECONDS}s"
true
