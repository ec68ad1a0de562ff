#!/usr/bin/env bash
# Prepared device call (~300 s cold): `bash research/calls/ab-varlen-det-diagonal.sh`, carrying [".whl",
# ".prebuilt/c10"]. .prebuilt/c10 holds research/prebuild.sh packs (bf16 hdim 64/128): HEAD's (main) and the patch's
# slim one.
#   varlen-det-diagonal (DIAGNOSTIC: deterministic packs walk up from each K/V tile's first Q tile, claim n
#   descending, rank from the last key tile) against HEAD (descending): bench_varlen --quick at hdim 64 and 128,
#   varlen rows in both modes and the dense det descending rows (the call's noise: their kernels are unchanged). The
#   det varlen rows' "bitwise as dense" flag is expected to fail on the variant (its ranks are not dense
#   descending's); its correctness check against the reference must pass.
set -u
source research/device_setup.sh .prebuilt/c10/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack "" "$OUT/build"  # HEAD: the pack the slim one names
timeout $((585 - SECONDS)) env AB_PREBUILT=/tmp/pb BENCH_TIMEOUT=110 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 64,128 --impl dash-varlen,dash-varlen-det,dash-dense-det-descending" \
  research/patch_ab.sh "$OUT/ab" research/patches/varlen-det-diagonal.patch 2>&1 | tail -34
[ -d "$OUT/ab/ab" ] && tar -czf "$OUT/ab.tgz" -C "$OUT/ab" ab && rm -rf "$OUT/ab"
echo "== done at ${SECONDS}s"
true
