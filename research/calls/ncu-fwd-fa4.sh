#!/usr/bin/env bash
# Prepared device call, right after a call that installed FA4 on the same warm machine (standing-fa4.sh 2):
# `bash research/calls/ncu-fwd-fa4.sh` carrying [".whl", ".prebuilt/c3"] (~400 s warm). Its ncu folder comes
# back as ncu.tar (session 27's run lost the per-kernel readings to the 8-file limit).
#   Nsight Compute beside FA4's forward, hdim 128, 8k, full then causal (issue 17: our forward is 0.88-0.94 of FA4's
#   at 8k-16k with the same tiles, warpgroups and registers): the source page's SASS with its executed instructions
#   and stall samples, read per step by research/ncu_sass.py (instructions per step and where the warps wait, ours
#   against FA4's), as session 13 did for the backward. Nothing to compare if FA4 is gone (a new machine): the call
#   says so and stops, so run it only warm.
#   Then issue 17's block target, last measured on 2026-12-02 (ours det 2-4% behind FA4 det): the Llama-3-8B block
#   step at 8k-32k with our attention (det, non-det) beside FA4's (det, non-det) and SDPA, one run.
set -u
source research/fa4_stage.sh || { echo "FA4 is not unpacked on this machine: run after the call that installs it"; exit 0; }
source research/device_setup.sh .prebuilt/c3/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import flash_attn_dash._C" 2>/dev/null || link_pack "${PACK:-sched-diagonal}" "$OUT/build"
ncu_read fwd128-8k --pass fwd --impl dash,fa4 --hdim 128 --seqlen 8k --mask full,causal
timeout $((585 - SECONDS)) python3 benchmarks/bench_block.py --model llama3-8b --seqlen 8k,16k,32k \
  --impl dash-det,dash,fa4-det,fa4,sdpa --json "$OUT/block.json" > "$OUT/block.txt" 2>&1
tail -24 "$OUT/block.txt"
echo "== done at ${SECONDS}s"
true
