#!/usr/bin/env bash
# Prepared device calls, two back to back (FA4 comes in two parts): `bash research/calls/standing-fa4.sh 1` carrying
# [".whl", ".prebuilt/c2", ".fa4x/q0"], then at once `bash research/calls/standing-fa4.sh 2` carrying
# [".whl", ".prebuilt/c3", ".fa4x/q1"]. .prebuilt/c2 holds research/prebuild.sh packs (bf16 hdim 64/128): HEAD's
# (PACK, default main) and, for part 1's A/B, the patch's (slim packs name HEAD's, which travels with them);
# .prebuilt/c3 HEAD's alone (part 2 carries FA4's larger part).
#   1: link HEAD; with PATCH (research/patches/X.patch), its varlen GPU tests on its build and bench_varlen --quick
#      at hdim 128 GQA 16/4 against HEAD (research/patch_ab.sh; the variant's build stays installed) (~330 s; TESTS1
#      names fewer test files).
#   2: FA4 installed from the two parts; the standing of the installed build beside FA4 and cuDNN: bench_attn hdim
#      64/128 1k-16k and bench_varlen --quick (~250 s). The build installed by an earlier call did not survive to
#      the next one in session 23: part 2 links PACK first when the extension does not import, with RELINK=1, or
#      with PATCH (applied first; .prebuilt/c3 then holds the patch's pack, named by PACK, and the pack it names).
#      FA4's first part must be sent again after a lost machine.
set -u
part=${1:?part 1 or 2}
source research/fa4_stage.sh ".fa4x/q$((part - 1))"
source research/device_setup.sh .prebuilt/c$((part + 1))/*.tar.xz
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu-$part.txt"
build() { link_pack "${PACK:-main}" "$OUT/build-$part"; }
if [ "$part" = 1 ]; then
  build
  if [ -n "${PATCH:-}" ]; then
    timeout 420 env AB_PREBUILT=/tmp/pb AB_TESTS="${TESTS1:-test_varlen_kernel_gpu test_varlen_gpu test_packed_gpu}" \
      AB_TEST_TIMEOUT=80 BENCH_TIMEOUT=90 BENCH_SCRIPT=benchmarks/bench_varlen.py \
      BENCH_ARGS="--quick --hdim 128 --heads-k 4 --impl dash-varlen,dash-varlen-det,dash-dense" \
      research/patch_ab.sh "$OUT/ab" "$PATCH" 2>&1 | tail -30
    [ -d "$OUT/ab/ab" ] && tar -czf "$OUT/ab.tgz" -C "$OUT/ab" ab && rm -rf "$OUT/ab"
  fi
else
  if [ -n "${PATCH:-}" ]; then git apply "$PATCH" || exit 1; fi
  if [ -n "${RELINK:-}${PATCH:-}" ] || ! python3 -c "import flash_attn_dash._C" 2>/dev/null; then build; fi
  timeout 300 python3 benchmarks/bench_attn.py --impl dash,dash-det,fa4,fa4-det,sdpa-cudnn --hdim 64,128 \
    --seqlen 1k,2k,8k,16k --json "$OUT/standing.json" > "$OUT/standing.txt" 2>&1
  tail -42 "$OUT/standing.txt"
  timeout 200 python3 benchmarks/bench_varlen.py --quick --json "$OUT/varlen.json" > "$OUT/varlen.txt" 2>&1
  tail -42 "$OUT/varlen.txt"
fi
true
