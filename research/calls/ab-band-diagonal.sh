#!/usr/bin/env bash
# Prepared device call (~540 s cold): `bash research/calls/ab-band-diagonal.sh` carrying [".whl", ".prebuilt/c16",
# ".prebuilt/c15"]. c16: HEAD's `suite` pack cut to bf16 hdim 64/128/256 (6 units of c13's); c15: the patch's pack
# `band-diagonal` (the same units, research/prebuild.sh with FROM=that suite: its forward objects are HEAD's, left
# out of the pack).
#   research/patches/band-diagonal.patch: the diagonal order runs on sliding-window bands (the up walk the model's
#   shift takes there) instead of falling back to descending. The two-store-warp model puts it at 1.013-1.019 of the
#   non-deterministic walk on Gemma's window (hdim 256, window 4096, 8k/16k) against descending's 1.012-1.098 for
#   store/compute 0.5-0.9; the product model prefers descending on wide windows. The call: the patch's window GPU
#   tests (every order on bands, the kernel's trace against the model's plan, bitwise runs) and racecheck of
#   sanitize_bwd at hdim 64, then bench_window on HEAD and on the patch: rows dash-det-descending and
#   dash-det-diagonal (on HEAD diagonal falls back to descending on a band: the two rows are the call's noise;
#   on the patch the diagonal row walks up). Decide auto's order on bands (schedule.auto.BAND_SCHEDULE) from it.
set -u
source research/device_setup.sh .prebuilt/c16/*.tar.xz .prebuilt/c15/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" 64,128,256 bf16
AB_BUILD="FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128,256" \
  AB_TESTS="test_window_gpu" AB_TEST_FILTER="diagonal" AB_TEST_TIMEOUT=120 \
  AB_SANITIZE="bwd" AB_SANITIZE_TOOLS=racecheck SANITIZE_HDIMS=64 SANITIZE_TIMEOUT=90 \
  BENCH_TIMEOUT=120 BENCH_SCRIPT=benchmarks/bench_window.py \
  BENCH_ARGS="--case gemma,mistral,gpt-oss --seqlen 8k,16k --impl dash,dash-det-descending,dash-det-diagonal" \
  ab_patch research/patches/band-diagonal.patch
echo "== done at ${SECONDS}s"
true
