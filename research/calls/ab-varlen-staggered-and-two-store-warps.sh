#!/usr/bin/env bash
# Prepared device call: `bash research/calls/ab-varlen-staggered-and-two-store-warps.sh [s] [w]` (the steps to run,
# default both: one cold call of ~370 s; s ~180 s, w ~250 s), carrying [".whl", ".prebuilt/c2"]. .prebuilt/c2 holds research/prebuild.sh packs (bf16 hdim 64/128): HEAD's
# (any name: the slim packs name it) and the two patches' slim packs (FROM= HEAD's).
#   1. varlen-staggered: test_varlen_kernel_gpu and test_packed_gpu on its build; bench_varlen --quick hdim 128 GQA
#      16/4 (non-det rows: the change) against HEAD.
#   2. bwd-dq-two-store-warps: test_bwd_gpu (det rows: bitwise repeats, dQ order = the model's) and synccheck of
#      tests/sanitize_bwd.py at hdim 128 (it changes who syncs on the hand-off barriers) on its build;
#      also test_varlen_kernel_gpu (det packs); bench_attn hdim 128 det 2k/8k against the installed build (after step
#      1, varlen-staggered's: its dense kernels differ from HEAD's only in one more zeroed counter per dQ tile).
set -u
# With .fa4x/q0 carried too, FA4's first part is kept for `research/calls/standing-fa4.sh 2` at once after this call
# (it then times the build installed last: step 2's, or HEAD's with RELINK=1).
[ -d .fa4x/q0 ] && source research/fa4_stage.sh .fa4x/q0
source research/device_setup.sh .prebuilt/c2/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
link_pack "" "$OUT/build"  # HEAD: the pack the slim ones name
R=research/patches
ab() {  # ab DIR SECONDS_TOTAL PATCH [env...]: patch_ab.sh cut at SECONDS_TOTAL into the call; what ran comes back
  local dir=$1 until=$2 patch=$3
  shift 3
  timeout $((until - SECONDS)) env AB_PREBUILT=/tmp/pb "$@" research/patch_ab.sh "$OUT/$dir" "$patch" 2>&1 | tail -24
  [ -d "$OUT/$dir/ab" ] && tar -czf "$OUT/$dir.tgz" -C "$OUT/$dir" ab && rm -rf "$OUT/$dir"
  echo "== $dir done at ${SECONDS}s"
}
steps=${*:-s w}
[[ " $steps " == *" s "* ]] && ab s 200 "$R/varlen-staggered.patch" AB_TESTS="test_varlen_kernel_gpu test_packed_gpu" AB_TEST_TIMEOUT=40 \
  BENCH_TIMEOUT=45 BENCH_SCRIPT=benchmarks/bench_varlen.py \
  BENCH_ARGS="--quick --hdim 128 --heads-k 4 --impl dash-varlen,dash-dense"
[[ " $steps " == *" w "* ]] && ab w $((SECONDS + 260)) "$R/bwd-dq-two-store-warps.patch" \
  AB_TESTS="test_bwd_gpu test_varlen_kernel_gpu" AB_TEST_TIMEOUT=40 BENCH_TIMEOUT=45 \
  AB_SANITIZE=bwd AB_SANITIZE_TOOLS=synccheck SANITIZE_HDIMS=128 SANITIZE_TIMEOUT=60 \
  BENCH_ARGS="--impl dash-det,sdpa-cudnn --hdim 128 --seqlen 2k,8k"
true
