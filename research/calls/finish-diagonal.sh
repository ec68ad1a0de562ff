#!/usr/bin/env bash
# Prepared device calls for branch `diagonal`, two back to back (FA4 comes in two parts):
#   `bash research/calls/finish-diagonal.sh 1` carrying [".whl", ".prebuilt/c3", ".fa4x/q0"] (~450 s cold), then at
#   once `bash research/calls/finish-diagonal.sh 2` carrying [".whl", ".prebuilt/c3", ".fa4x/q1"] (~330 s).
# .prebuilt/c3 holds the branch's research/prebuild.sh pack `sched-diagonal` (bf16 hdim 64/128, full).
#   1: the GPU tests session 25's call 1 left unrun (test_bwd_gpu and test_varlen_kernel_gpu stopped at --maxfail on
#      two stale tests, fixed in cc7afef), test_window_gpu (its orders now include split and diagonal, which fall
#      back to descending on bands) and test_packed_gpu; synccheck/racecheck of sanitize_bwd at hdim 128.
#   2: FA4 installed from the two parts; the standing beside FA4 and cuDNN with the diagonal rows: bench_attn hdim
#      64/128 1k-16k and bench_varlen --quick (issue 18's targets: hdim 64 Pareto det / FA4 det and / FA4 non-det).
set -u
part=${1:?part 1 or 2}
source research/fa4_stage.sh ".fa4x/q$((part - 1))"
source research/device_setup.sh .prebuilt/c3/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu-$part.txt"
if [ "$part" = 1 ] || ! python3 -c "import flash_attn_dash._C" 2>/dev/null; then link_pack sched-diagonal "$OUT/build-$part"; fi
if [ "$part" = 1 ]; then
  FLASH_DASH_TEST_BUILT_ONLY=1 DEADLINE_S=360 TESTS="test_bwd_gpu test_varlen_kernel_gpu test_window_gpu test_packed_gpu" \
    TEST_TIMEOUT=150 SANITIZE_PASSES=bwd SANITIZE_HDIMS=128 SANITIZE_TIMEOUT=100 \
    benchmarks/gpu_session.sh "$OUT/check" tests sanitize > /dev/null 2>&1
  cat "$OUT/check/summary.txt"
else
  timeout 330 python3 benchmarks/bench_attn.py --impl dash,dash-det,dash-det-diagonal,fa4,fa4-det,sdpa-cudnn \
    --hdim 64,128 --seqlen 1k,2k,8k,16k --json "$OUT/standing.json" > "$OUT/standing.txt" 2>&1
  tail -48 "$OUT/standing.txt"
  timeout $((585 - SECONDS)) python3 benchmarks/bench_varlen.py --quick --json "$OUT/varlen.json" \
    > "$OUT/varlen.txt" 2>&1
  tail -42 "$OUT/varlen.txt"
fi
echo "== done at ${SECONDS}s"
true
