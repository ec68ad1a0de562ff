#!/usr/bin/env bash
# One device call over prebuilt variants: each folder .prebuilt/<name>/ with `make kernels` objects and a flags.txt
# (what differs) is linked in turn (pip install with FLASH_DASH_PREBUILT_DIR) and probed:
#   bench_args.txt -> benchmarks/bench_attn.py with those arguments (whole-build variants: bf16 fwd + bwd objects);
#   otherwise      -> research/fwd_variants.py with $FWD_PROBE_ARGS and the folder's probe_args.txt, after the
#                     bf16 forward tests (forward-only variants).
# The installed build is probed first with the same forward arguments, for the same-call baseline.
#
#   research/variants.sh OUTDIR
set -u -o pipefail
OUTDIR=${1:?usage: variants.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
link() {  # link DIR [env...]: install the extension from the folder's objects
  local dir=$1; shift
  env "$@" FLASH_DASH_PREBUILT_DIR="$dir" python3 -m pip install --no-build-isolation --no-deps -v -e . \
    > "$OUTDIR/build-$(basename "$dir").log" 2>&1
}
# shellcheck disable=SC2086  # FWD_PROBE_ARGS holds several arguments
timeout 120 python3 research/fwd_variants.py installed ${FWD_PROBE_ARGS:-} --json "$OUTDIR/fwd-installed.json" \
  | tee "$OUTDIR/probe-installed.txt"
for dir in .prebuilt/*/; do
  [ -f "$dir/flags.txt" ] || continue
  name=$(basename "$dir")
  if [ -f "$dir/bench_args.txt" ]; then
    link "$dir" FLASH_DASH_DTYPES=bf16 || { echo "$name: link failed"; continue; }
    # shellcheck disable=SC2046  # the file holds several arguments
    timeout 240 python3 benchmarks/bench_attn.py $(cat "$dir/bench_args.txt") --json "$OUTDIR/bench-$name.json" \
      > "$OUTDIR/bench-$name.txt" 2>&1
    echo "variant $name ($(cat "$dir/flags.txt")): bench rc $?"
    grep -E "^(dash|cuDNN|SDPA|FA4)" "$OUTDIR/bench-$name.txt"
  else
    link "$dir" FLASH_DASH_PASSES=fwd FLASH_DASH_DTYPES=bf16 || { echo "$name: link failed"; continue; }
    timeout 120 python3 -m pytest -q -p no:cacheprovider -k dtype0 tests/test_fwd_gpu.py > "$OUTDIR/fwd-$name.log" 2>&1
    echo "variant $name ($(cat "$dir/flags.txt")): tests $(tail -1 "$OUTDIR/fwd-$name.log")"
    # shellcheck disable=SC2046,SC2086
    timeout 120 python3 research/fwd_variants.py "$name" ${FWD_PROBE_ARGS:-} $(cat "$dir/probe_args.txt" 2>/dev/null) \
      --json "$OUTDIR/fwd-$name.json" | tee "$OUTDIR/probe-$name.txt"
  fi
done
