#!/usr/bin/env bash
# Prepared device call (~400-550 s): `bash research/calls/suite-head-dims.sh CARRY HDIMS [DTYPES]`, carrying
# [".whl", CARRY], e.g. `... .prebuilt/c8 256 bf16,fp16`. CARRY holds one research/prebuild.sh-style pack named
# `suite` with HEAD's objects of the units to link (session 23's .prebuilt/c8/suite.tar.xz: all 20 default units,
# bf16 and fp16 x hdim 64/96/128/192/256, harvested from a fresh-clone `.ci/run`'s `make kernels`, whose digests are
# the tree's; 34 MB). The GPU suites of a change that reaches every head dim (session 23's det dQ store), on the head
# dims and dtypes the bf16 64/128 calls leave out:
#   test_bwd_gpu, test_fwd_gpu, test_varlen_kernel_gpu, test_gqa_fold_gpu, test_softcap_gpu, test_window_gpu,
#   test_sink_gpu (FLASH_DASH_TEST_BUILT_ONLY=1: what reaches an unbuilt head dim or dtype is a skip), then
#   racecheck and synccheck of tests/sanitize_bwd.py at HDIMS when bf16 is built (the sanitizer scripts run bf16;
#   SANITIZE_PASSES=fwd sanitizes the forward instead, for a forward-only change).
set -u
carry=${1:?CARRY folder}
hdims=${2:?HDIMS, e.g. 256 or 192,192v128}
dtypes=${3:-bf16}
source research/device_setup.sh "$carry"/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" "$hdims" "$dtypes"
steps=(tests)
[[ ",$dtypes," == *",bf16,"* ]] && steps+=(sanitize)
FLASH_DASH_TEST_BUILT_ONLY=1 DEADLINE_S=$((560 - SECONDS)) TEST_TIMEOUT=120 SANITIZE_PASSES="${SANITIZE_PASSES:-bwd}" \
  SANITIZE_HDIMS="$hdims" SANITIZE_TIMEOUT=200 \
  TESTS="test_bwd_gpu test_fwd_gpu test_varlen_kernel_gpu test_gqa_fold_gpu test_softcap_gpu test_window_gpu test_sink_gpu" \
  benchmarks/gpu_session.sh "$OUT/suite" "${steps[@]}" > /dev/null 2>&1
cat "$OUT/suite/summary.txt"
true
