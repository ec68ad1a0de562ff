#!/usr/bin/env bash
# One device call: the installed build against a source patch, timed in the same call.
#
#   research/patch_ab.sh OUTDIR PATCH [PATCH ...]
#
# Times benchmarks/bench_attn.py $BENCH_ARGS on the installed build, applies each PATCH in turn on top of the
# previous ones (git apply), rebuilds in place (pip install -e: only the translation units the patch touches
# recompile), times again and prints research/compare_runs.py's ratios of every build to the first. Use it on a
# machine that already holds a build (benchmarks/gpu_session.sh build) and keep a peer's rows in BENCH_ARGS (e.g.
# fa4): their ratio between runs is the noise of the call. The tree is left patched. Everything lands in one
# gzipped tar, OUTDIR/ab.tgz (the device returns few files).
set -u -o pipefail
OUTDIR=${1:?usage: patch_ab.sh OUTDIR PATCH [PATCH ...]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
AB="$OUTDIR/ab"
mkdir -p "$AB"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
BENCH_ARGS=${BENCH_ARGS:---impl dash,dash-det,fa4 --hdim 64,128 --seqlen 2k,8k,16k}
bench() {  # bench NAME: one bench_attn.py run into $AB
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-200}" python3 benchmarks/bench_attn.py $BENCH_ARGS --json "$AB/bench-$1.json" \
    > "$AB/bench-$1.txt" 2>&1
  echo "bench $1 rc $?"
}
finish() { tar -czf "$OUTDIR/ab.tgz" -C "$OUTDIR" ab && rm -rf "$AB"; }
bench installed
jsons=()
for patch in "$@"; do
  name=$(basename "$patch" .patch)
  git apply "$patch" || { echo "$name: does not apply"; finish; exit 1; }
  SECONDS=0
  python3 -m pip install --no-build-isolation --no-deps -v -e . > "$AB/build-$name.log" 2>&1 \
    || { echo "$name: build failed"; grep -m 20 error "$AB/build-$name.log"; finish; exit 1; }
  echo "$name: built in ${SECONDS}s"
  bench "$name"
  jsons+=("$AB/bench-$name.json")
done
python3 research/compare_runs.py "$AB/bench-installed.json" "${jsons[@]}" | tee "$AB/compare.txt"
finish
