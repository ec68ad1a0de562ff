#!/usr/bin/env bash
# Smallest device call for bwd-dq-two-store-warps (~90 s on an H100, ~160 s elsewhere), carrying
# [".whl", ".prebuilt/c4"] (HEAD's pack and the patch's slim pack, which names it). On an H100 it measures only
# the patch (its HEAD rows: this session's earlier H100 call, 2026-12-07-0303-...-installed; cuDNN rows calibrate);
# on any other GPU HEAD first, in the same call.
set -u
source research/device_setup.sh .prebuilt/c4/*.tar.xz > /dev/null
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$gpu"
bench() { timeout 60 python3 benchmarks/bench_attn.py --impl dash-det,sdpa-cudnn --hdim 128 --seqlen 2k,8k \
  --json "$OUT/bench-$1.json" > "$OUT/bench-$1.txt" 2>&1; tail -9 "$OUT/bench-$1.txt"; }
link() { env FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128 FLASH_DASH_PREBUILT_DIR="/tmp/pb/$1" \
  benchmarks/gpu_session.sh "$OUT/build-$1" build > "$OUT/build-$1.log" 2>&1; tail -1 "$OUT/build-$1/summary.txt"; }
if [[ "$gpu" != *H100* ]]; then link "$(cat /tmp/pb/*/from | head -1)"; bench head; fi  # HEAD: the pack the slim one names
git apply research/patches/bwd-dq-two-store-warps.patch && link bwd-dq-two-store-warps
FLASH_DASH_TEST_BUILT_ONLY=1 timeout 40 python3 -m pytest -q -x tests/test_bwd_gpu.py > "$OUT/test_bwd.txt" 2>&1
tail -1 "$OUT/test_bwd.txt"
bench two-store-warps
git apply -R research/patches/bwd-dq-two-store-warps.patch
