#!/usr/bin/env bash
# Prepared device call, right after a call that installed FA4 on the same warm machine (standing-fa4.sh 2
# or ncu-fwd-fa4.sh): `bash research/calls/window-fa4.sh` carrying [".whl", ".prebuilt/c16"]
# (c16: the `suite` pack cut to bf16 hdim 64/128/256; ~450 s warm).
#   Issue 19's windowed targets beside FA4, last measured on 2026-12-05 (session 10), before the two dQ-store warps
#   (session 23) and hdim 256 causal's order (session 16): Gemma-shaped windows (hdim 256, 16/8 heads, window 4096,
#   softcap 50) det 0.90 / 0.93 of FA4 det at 8k / 16k with a 31% det tax (non-det equal to FA4's); its global
#   layers (hdim256 causal); gpt-oss (window 128 + sinks) and its causal baseline at 32k (window 128 costs <= 5% of
#   the causal backward). Links the suite at hdim 64, 128 and 256 (bf16) first.
set -u
source research/fa4_stage.sh || { echo "FA4 is not unpacked on this machine: run after the call that installs it"; exit 0; }
source research/device_setup.sh .prebuilt/c16/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack suite "$OUT/build" 64,128,256 bf16
timeout $((400 - SECONDS)) python3 benchmarks/bench_window.py --case gemma,hdim256 --seqlen 8k,16k \
  --json "$OUT/window-gemma.json" > "$OUT/window-gemma.txt" 2>&1
tail -20 "$OUT/window-gemma.txt"
timeout $((585 - SECONDS)) python3 benchmarks/bench_window.py --case gpt-oss,causal --seqlen 32k \
  --json "$OUT/window-gptoss.json" > "$OUT/window-gptoss.txt" 2>&1
tail -12 "$OUT/window-gptoss.txt"
echo "== done at ${SECONDS}s"
true
