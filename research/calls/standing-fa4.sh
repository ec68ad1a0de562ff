#!/usr/bin/env bash
# Prepared device calls, two back to back (FA4 comes in two parts): `bash research/calls/standing-fa4.sh 1` carrying
# [".whl", ".prebuilt/c2", ".fa4x/q0"], then at once `bash research/calls/standing-fa4.sh 2` carrying
# [".whl", ".prebuilt/c2", ".fa4x/q1"]. .prebuilt/c2 holds HEAD's research/prebuild.sh pack (bf16 hdim 64/128) as
# PACK.tar.xz; PACK (env, default main) names it.
#   1: link HEAD; the GPU tests of the varlen path and both passes on what it built (~300 s).
#   2: FA4 installed from the two parts; the standing beside FA4 and cuDNN: bench_attn hdim 64/128 1k-16k and
#      bench_varlen --quick (~200 s). If the machine went back between the calls, part 2 relinks first and FA4's
#      first part must be sent again.
set -u
part=${1:?part 1 or 2}
source research/fa4_stage.sh ".fa4x/q$((part - 1))"
source research/device_setup.sh .prebuilt/c2/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu-$part.txt"
build() {
  env FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128 FLASH_DASH_PREBUILT_DIR="/tmp/pb/${PACK:-main}" \
    benchmarks/gpu_session.sh "$OUT/build-$part" build > "$OUT/build-$part.log" 2>&1
  tail -3 "$OUT/build-$part/summary.txt"
}
if [ "$part" = 1 ]; then
  build
  FLASH_DASH_TEST_BUILT_ONLY=1 TEST_TIMEOUT=100 TESTS="test_varlen_gpu test_varlen_kernel_gpu test_packed_gpu \
test_integration_torch_flash_gpu test_integration_hf_gpu test_api_gpu test_fwd_gpu test_bwd_gpu test_window_gpu" \
    timeout 420 benchmarks/gpu_session.sh "$OUT/t" tests > "$OUT/t.log" 2>&1
  tail -12 "$OUT/t/summary.txt"
else
  python3 -c "import flash_attn_dash._C" 2>/dev/null || build
  timeout 300 python3 benchmarks/bench_attn.py --impl dash,dash-det,fa4,fa4-det,sdpa-cudnn --hdim 64,128 \
    --seqlen 1k,2k,8k,16k --json "$OUT/standing.json" > "$OUT/standing.txt" 2>&1
  tail -45 "$OUT/standing.txt"
  timeout 200 python3 benchmarks/bench_varlen.py --quick --json "$OUT/varlen.json" > "$OUT/varlen.txt" 2>&1
  tail -45 "$OUT/varlen.txt"
fi
