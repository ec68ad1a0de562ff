#!/usr/bin/env bash
# Prepared device call (~350 s cold): `bash research/calls/varlen-orders-head-dims.sh` carrying [".whl",
# ".prebuilt/c13"] (c13: the branch's `suite` pack, all 20 default units, from research/prebuild.sh).
#   Deterministic varlen `auto` picks its order by head dim and mask (launch.VARLEN_AUTO_DIAGONAL_HDIMS: diagonal at
#   hdim 64 causal, descending elsewhere). The model (research/overlap_model.py, session 25) puts diagonal ahead of
#   descending on long-tailed causal packs at hdim 96 / 192 / 256 (1.055 / 1.020 / 1.121 vs 1.008 / 0.995 / 1.018
#   of ideal at Pareto 16k) and behind on uniform ones (dense-like, +5-7% for descending), as measured at hdim 128.
#   This measures both orders on the quick packs (Pareto 16k/64k, uniform causal 2k/8k) at those head dims, with
#   the bitwise check of each row against its documents' dense calls in the order varlen_schedule_used reports.
#   Widen VARLEN_AUTO_DIAGONAL_HDIMS only where diagonal wins on both kinds of pack (as at hdim 64), since auto
#   may not look at the pack.
set -u
source research/device_setup.sh .prebuilt/c13/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" 96,192,256 bf16
timeout $((585 - SECONDS)) python3 benchmarks/bench_varlen.py --quick --hdim 96,192,256 --mask causal \
  --impl ours-varlen-orders --json "$OUT/varlen-orders.json" > "$OUT/varlen-orders.txt" 2>&1
tail -45 "$OUT/varlen-orders.txt"
echo "== done at ${SECONDS}s"
true
