#!/usr/bin/env bash
# One device call: the installed build against source patches, each timed in the same call.
#
#   research/patch_ab.sh OUTDIR PATCH [PATCH ...]
#
# A PATCH argument may stack several patches, A.patch+B.patch: applied one after the other as one variant (each
# must apply on top of the ones before it).
# Times $BENCH_SCRIPT (benchmarks/bench_attn.py by default, or bench_varlen.py) $BENCH_ARGS on the installed build,
# then each PATCH alone on the clean tree (git apply, rebuilt in place with the build knobs $AB_BUILD, by default bf16
# and hdim 64/128 only: the kernels a bench of those rows runs are the same whatever else is built, and fewer
# translation units compile), and prints research/compare_runs.py's ratios of every variant to the installed build.
# AB_PREBUILT=DIR: a variant whose folder DIR/<name> exists (<name>: the patch's file name without .patch, a stack's
# names joined by +) links the `make kernels` objects there that were compiled from the patched tree (setup.py checks
# each one's digest stamp and compiles any other), so the call spends its time measuring instead of compiling. A
# variant that touches neither hopper/, csrc/, setup.py nor build_config.py (host Python only) is not rebuilt while
# the installed extension is still the clean tree's (no kernel variant before it in this call).
# AB_TESTS="test_bwd_gpu ..." (tests/ files) and AB_SANITIZE="bwd fwd" (tests/sanitize_*.py under the tools
# AB_SANITIZE_TOOLS, racecheck and synccheck by default) check each variant after its build and before its bench, on what it compiled
# (FLASH_DASH_TEST_BUILT_ONLY=1, AB_TEST_FILTER as pytest -k); the tests' last lines are printed. AB_NO_BENCH=1: only
# build and check (a call before FA4 has arrived).
# Use it on a machine that already holds a build (benchmarks/gpu_session.sh build) and keep a peer's rows in
# BENCH_ARGS (e.g. fa4): their ratio between runs is the noise of the call. The tree is restored, the last variant's
# build stays installed. Everything lands in one gzipped tar, OUTDIR/ab.tgz (the device returns few files).
set -u -o pipefail
OUTDIR=${1:?usage: patch_ab.sh OUTDIR PATCH [PATCH ...]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
AB="$OUTDIR/ab"
mkdir -p "$AB"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
BENCH_SCRIPT=${BENCH_SCRIPT:-benchmarks/bench_attn.py}
BENCH_ARGS=${BENCH_ARGS:---impl dash,dash-det,fa4 --hdim 64,128 --seqlen 2k,8k,16k}
AB_BUILD=${AB_BUILD:-FLASH_DASH_DTYPES=bf16 FLASH_DASH_HDIMS=64,128}
bench() {  # bench NAME: one bench_attn.py run into $AB (none with AB_NO_BENCH)
  [ -n "${AB_NO_BENCH:-}" ] && return 1
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-200}" python3 "$BENCH_SCRIPT" $BENCH_ARGS --json "$AB/bench-$1.json" \
    > "$AB/bench-$1.txt" 2>&1
  echo "bench $1 rc $?"
}
check() {  # check NAME: AB_TESTS and AB_SANITIZE on the variant just built (gpu_session.sh's tests and sanitize)
  local steps=()
  [ -n "${AB_TESTS:-}" ] && steps+=(tests)
  [ -n "${AB_SANITIZE:-}" ] && steps+=(sanitize)
  [ "${#steps[@]}" -gt 0 ] || return 0
  FLASH_DASH_TEST_BUILT_ONLY=1 TESTS="${AB_TESTS:-}" TEST_FILTER="${AB_TEST_FILTER:-}" \
    TEST_TIMEOUT="${AB_TEST_TIMEOUT:-200}" SANITIZE_PASSES="${AB_SANITIZE:-}" \
    SANITIZE_TOOLS="${AB_SANITIZE_TOOLS:-racecheck synccheck}" benchmarks/gpu_session.sh "$AB/check-$1" "${steps[@]}" \
    | sed "s/^/$1: /"
}
finish() { tar -czf "$OUTDIR/ab.tgz" -C "$OUTDIR" ab && rm -rf "$AB"; }
kernel_change() {  # kernel_change PATCH...: whether the patches touch what the extension compiles
  local p
  for p in "$@"; do
    git apply --numstat "$p" | cut -f3 | grep -qE '^(hopper|csrc)/|^(setup|build_config)\.py$' && return 0
  done
  return 1
}
rebuilt=0  # whether a variant has replaced the installed extension
revert() {  # revert PATCH...: undo applied patches, the last one first
  local i
  for ((i = $# ; i >= 1; i--)); do git apply -R "${!i}"; done
}
bench installed
jsons=()
for arg in "$@"; do
  IFS=+ read -r -a patches <<< "$arg"
  name=$(for p in "${patches[@]}"; do basename "$p" .patch; done | paste -sd+)
  applied=()
  for p in "${patches[@]}"; do git apply "$p" && applied+=("$p") || break; done
  if [ "${#applied[@]}" -lt "${#patches[@]}" ]; then
    revert "${applied[@]}"
    echo "$name: does not apply"; continue
  fi
  SECONDS=0
  prebuilt=()
  [ -n "${AB_PREBUILT:-}" ] && [ -d "$AB_PREBUILT/$name" ] && prebuilt=("FLASH_DASH_PREBUILT_DIR=$AB_PREBUILT/$name")
  if [ "$rebuilt" = 0 ] && ! kernel_change "${patches[@]}"; then
    echo "$name: no kernel change, runs on the installed build (editable: its Python is the patched tree's)"
  else
    rebuilt=1
    # shellcheck disable=SC2086
    if ! env $AB_BUILD "${prebuilt[@]}" python3 -m pip install --no-build-isolation --no-deps -v -e . \
        > "$AB/build-$name.log" 2>&1; then
      echo "$name: build failed"; grep -m 20 error "$AB/build-$name.log"
      revert "${patches[@]}"
      continue
    fi
    echo "$name: built in ${SECONDS}s"
  fi
  check "$name"
  bench "$name" && jsons+=("$AB/bench-$name.json")
  revert "${patches[@]}"
done
[ "${#jsons[@]}" -gt 0 ] && python3 research/compare_runs.py "$AB/bench-installed.json" "${jsons[@]}" | tee "$AB/compare.txt"
finish
