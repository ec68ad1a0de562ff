#!/usr/bin/env bash
# One device call over prebuilt variants, measured against the installed build in the same call.
#
#   research/variants.sh OUTDIR
#
# Each folder .prebuilt/<name>/ with `make kernels` bf16 objects and a flags.txt (what differs) is linked in turn
# (pip install with FLASH_DASH_PREBUILT_DIR), checked with the bf16 GPU tests (test_fwd_gpu, test_bwd_gpu) and timed
# with benchmarks/bench_attn.py $BENCH_ARGS (or the folder's bench_args.txt), and with compute-sanitizer on
# tests/sanitize_{$SANITIZE_PASSES}.py when that is set. The installed build is timed first with
# the same arguments; research/compare_runs.py prints each variant's ratio to it. Folders without flags.txt are
# skipped. The installed build is not restored: link the one you want next.
set -u -o pipefail
OUTDIR=${1:?usage: variants.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
BENCH_ARGS=${BENCH_ARGS:---impl dash,dash-det,sdpa-cudnn --seqlen 2k,8k}
bench() {  # bench NAME ARGS...
  local name=$1; shift
  # shellcheck disable=SC2068
  timeout 300 python3 benchmarks/bench_attn.py $@ --json "$OUTDIR/bench-$name.json" > "$OUTDIR/bench-$name.txt" 2>&1
  echo "bench $name rc $?"
}
# shellcheck disable=SC2086
bench installed $BENCH_ARGS
jsons=()
for dir in .prebuilt/*/; do
  [ -f "$dir/flags.txt" ] || continue
  name=$(basename "$dir")
  FLASH_DASH_DTYPES=bf16 FLASH_DASH_PREBUILT_DIR="$dir" python3 -m pip install --no-build-isolation --no-deps -v -e . \
    > "$OUTDIR/link-$name.log" 2>&1 || { echo "$name: link failed"; continue; }
  for t in test_fwd_gpu test_bwd_gpu; do
    FLASH_DASH_TEST_BUILT_ONLY=1 timeout 200 python3 -m pytest -q -p no:cacheprovider -x "tests/$t.py" \
      > "$OUTDIR/$t-$name.log" 2>&1
    echo "variant $name ($(cat "$dir/flags.txt")): $t $(tail -1 "$OUTDIR/$t-$name.log")"
  done
  for pass in ${SANITIZE_PASSES:-}; do  # e.g. SANITIZE_PASSES="bwd fwd": compute-sanitizer on the variant too
    for tool in racecheck synccheck; do
      timeout 150 compute-sanitizer --tool "$tool" python3 "tests/sanitize_$pass.py" > "$OUTDIR/sanitize-$pass-$tool-$name.log" 2>&1
      echo "variant $name: sanitize $pass $tool (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/sanitize-$pass-$tool-$name.log" | tail -1)"
    done
  done
  # shellcheck disable=SC2046,SC2086
  bench "$name" $( [ -f "$dir/bench_args.txt" ] && cat "$dir/bench_args.txt" || echo $BENCH_ARGS)
  jsons+=("$OUTDIR/bench-$name.json")
done
[ "${#jsons[@]}" -gt 0 ] && python3 research/compare_runs.py "$OUTDIR/bench-installed.json" "${jsons[@]}" \
  | tee "$OUTDIR/compare.txt"
