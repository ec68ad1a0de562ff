#!/usr/bin/env bash
# Prepared device call (~250 s cold): `bash research/calls/ncu-varlen-fwd.sh` carrying [".whl", ".prebuilt/c3"].
#   Issue 18's varlen / dense forward gap at equal shapes: hdim 128, uniform 2k packs, varlen 0.956 (full) / 0.958
#   (causal) of the dense forward on the H100 after the stage broadcast (session 29), 0.974 / 1.006 at 8k: a cost
#   per tile. Nsight Compute on the dense and the varlen forward of the same tensors (research/ncu_attn.py:
#   dash-varlen runs them as one uniform pack), the source page's SASS with executed instructions and stall samples
#   (research/ncu_sass.py), to say where the varlen kernel's extra time per tile goes: the consumers' tile change
#   (the claim ring, the table reads, the division of block_head), the producer's claim (an atomic and two dependent
#   table reads before the next tile's loads), or the staged O epilogue and its copy warps.
set -u
source research/device_setup.sh .prebuilt/c3/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack "${PACK:-sched-diagonal}" "$OUT/build"
ncu_read varlen-fwd128-2k --pass fwd --impl dash,dash-varlen --hdim 128 --seqlen 2k --mask full,causal
echo "== done at ${SECONDS}s"
true
