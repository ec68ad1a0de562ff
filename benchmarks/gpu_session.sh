#!/usr/bin/env bash
# One GPU-machine session in one call: build, GPU tests, compute-sanitizer, benchmarks, forward variants
# (in that order, most important first).
#
#   benchmarks/gpu_session.sh OUTDIR [steps...]
#   steps: build tests sanitize profile ncu-fwd fwd-overhead bench (quick) bench-attn bench-block variants
#   (default: build tests sanitize bench variants)
#
# Variants: every folder .prebuilt/<name>/ holding `make kernels` objects and a flags.txt (what differs)
# is linked in turn. Forward variants (fwd objects only, FLASH_DASH_PASSES=fwd) are probed with
# benchmarks/fwd_variants.py (arguments: $FWD_PROBE_ARGS, then the variant's probe_args.txt; the
# installed build gets $FWD_PROBE_ARGS) and the bf16 forward tests; the fwd-overhead step takes
# $FWD_OVERHEAD_ARGS; whole-build variants (bf16 fwd + bwd objects)
# run benchmarks/bench_attn.py with the arguments in their bench_args.txt (compare with the bench-attn
# step of the same call), or the shell command in their command.txt ($VARIANT_JSON names a log file
# for it). Logs go to OUTDIR as tars (few files back).
set -u -o pipefail
OUTDIR=${1:?usage: gpu_session.sh OUTDIR [steps...]}
shift
STEPS=${*:-build tests sanitize bench variants}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LOG="$OUTDIR/logs"
mkdir -p "$LOG"
touch "$LOG/.start"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
has() { [[ " $STEPS " == *" $1 "* ]]; }
summary=()
# Re-packed after every step so a call cut short by its time limit still brings back what ran.
pack() { tar -cf "$OUTDIR/logs.tar" -C "$OUTDIR" logs; printf '%s\n' "${summary[@]}" > "$OUTDIR/summary.txt"; }

build() {  # build [env...]: pip install the extension against the installed torch
  env "$@" python3 -m pip install --no-build-isolation --no-deps -v -e . > "$LOG/build-$BUILD_TAG.log" 2>&1
}

if has build; then
  BUILD_TAG=default; SECONDS=0
  build || { grep -E "error" "$LOG/build-default.log" | head -30; exit 1; }
  summary+=("build: ${SECONDS}s")
  pack
fi
if has tests; then
  for t in test_api_gpu test_fwd_gpu test_bwd_gpu test_bwd_timeline; do
    timeout 400 python3 -m pytest -q -p no:cacheprovider --maxfail=10 "tests/$t.py" > "$LOG/$t.log" 2>&1
    summary+=("$t: $(tail -1 "$LOG/$t.log")")
    pack
  done
fi
if has sanitize; then  # SANITIZE_PASSES: which of tests/sanitize_{bwd,fwd}.py (default both)
  for pass in ${SANITIZE_PASSES:-bwd fwd}; do
    for tool in ${SANITIZE_TOOLS:-racecheck synccheck}; do
      timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" python3 "tests/sanitize_$pass.py" \
        > "$LOG/sanitize-$pass-$tool.log" 2>&1
      summary+=("sanitize $pass $tool (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitize-$pass-$tool.log" | tail -1)")
      pack
    done
  done
fi
bench() {  # bench TAG SECONDS run_bench.sh-args...: results land in benchmarks/results, packed at once
  local tag=$1 limit=$2; shift 2
  timeout "$limit" env PYTHON=python3 benchmarks/run_bench.sh "$@" benchmarks/results > "$LOG/$tag.log" 2>&1
  summary+=("$tag rc $?")
  # Only this call's files: the whole folder (17 MB by session 8) is over the size that comes back.
  find benchmarks/results -type f -newer "$LOG/.start" -print0 | tar -cf "$OUTDIR/results.tar" --null -T -
  pack
}
if has profile; then  # per-kernel backward time (preprocess / main / postprocess), hdim 128 full, both modes
  for mode in "" --deterministic; do
    timeout 120 python3 benchmarks/profile_bwd.py --hdim 128 --seqlen 512,2048 $mode > "$LOG/profile-bwd${mode}.txt" 2>&1
    summary+=("profile_bwd ${mode:-non-det} rc $?")
  done
  pack
fi
if has ncu-fwd; then  # Nsight Compute: our forward and cuDNN's, one launch each (NCU_FWD_ARGS: shape)
  # The report keeps the warp-stall samples per SASS instruction (SourceCounters; the kernels carry -lineinfo):
  # the details page goes to ncu-fwd.txt, the per-instruction table to ncu-fwd-sass.csv.gz.
  timeout 240 ncu --profile-from-start off --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters -f -o "$LOG/ncu-fwd" \
    python3 benchmarks/ncu_fwd.py ${NCU_FWD_ARGS:---hdim 128 --seqlen 2k} > "$LOG/ncu-fwd-run.txt" 2>&1
  summary+=("ncu-fwd rc $?")
  ncu -i "$LOG/ncu-fwd.ncu-rep" --page details > "$LOG/ncu-fwd.txt" 2>&1
  ncu -i "$LOG/ncu-fwd.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$LOG/ncu-fwd-sass.csv.gz"
  rm -f "$LOG/ncu-fwd.ncu-rep"
  pack
fi
if has fwd-overhead; then  # per-tile forward overhead (time against keys per tile), ours and cuDNN, both head dims
  for d in 128 64; do
    # shellcheck disable=SC2086  # FWD_OVERHEAD_ARGS holds several arguments
    timeout 120 python3 benchmarks/fwd_overhead.py --hdim $d ${FWD_OVERHEAD_ARGS:-} --json "$LOG/fwd-overhead-$d.json" > "$LOG/fwd-overhead-$d.txt" 2>&1
    summary+=("fwd-overhead hdim $d rc $?: $(grep -h 'overhead' "$LOG/fwd-overhead-$d.txt" | tr '\n' ';')")
  done
  pack
fi
has bench && bench bench-quick 300 --quick
has bench-attn && bench bench-attn 400 --attn-only     # the whole DASH grid (512..16k)
has bench-block && bench bench-block 400 --block-only  # 3 models x 4k..32k
variant_kind() {  # variant_kind DIR: none (no flags.txt: plain objects), command, bench or fwd
  if [ ! -f "$1/flags.txt" ]; then echo none
  elif [ -f "$1/command.txt" ]; then echo command
  elif [ -f "$1/bench_args.txt" ]; then echo bench
  else echo fwd
  fi
}
if has variants; then
  # Forward variants compare with the installed build: probe it first, once, if any is carried.
  for dir in .prebuilt/*/; do
    if [ "$(variant_kind "$dir")" = fwd ]; then
      # shellcheck disable=SC2086  # FWD_PROBE_ARGS holds several arguments
      timeout 120 python3 benchmarks/fwd_variants.py installed ${FWD_PROBE_ARGS:-} --json "$LOG/fwd-installed.json" > "$LOG/probe-installed.txt" 2>&1
      cat "$LOG/probe-installed.txt"
      break
    fi
  done
  for dir in .prebuilt/*/; do
    kind=$(variant_kind "$dir")
    [ "$kind" = none ] && continue
    name=$(basename "$dir")
    BUILD_TAG=$name
    if [ "$kind" = command ]; then  # whole-build variant that brings its own measurement
      build FLASH_DASH_DTYPES=bf16 FLASH_DASH_PREBUILT_DIR="$dir" || { summary+=("$name: build failed"); continue; }
      VARIANT_JSON="$LOG/$name.json" timeout 200 bash -c "$(cat "$dir/command.txt")" > "$LOG/cmd-$name.txt" 2>&1
      summary+=("variant $name ($(cat "$dir/flags.txt")): command rc $?")
      tail -40 "$LOG/cmd-$name.txt"
      pack
      continue
    fi
    if [ "$kind" = bench ]; then
      # Bad arguments fail here in a second, not after a link (session 4 lost a variant to --repeats 1).
      # shellcheck disable=SC2046
      python3 benchmarks/bench_attn.py $(cat "$dir/bench_args.txt") --dry-run > /dev/null 2> "$LOG/args-$name.txt" \
        || { summary+=("$name: bench_args.txt rejected: $(tail -1 "$LOG/args-$name.txt")"); continue; }
      build FLASH_DASH_DTYPES=bf16 FLASH_DASH_PREBUILT_DIR="$dir" || { summary+=("$name: build failed"); continue; }
      # shellcheck disable=SC2046  # the file holds several arguments
      timeout 200 python3 benchmarks/bench_attn.py $(cat "$dir/bench_args.txt") --json "$LOG/bench-$name.json" \
        > "$LOG/bench-$name.txt" 2>&1
      summary+=("variant $name ($(cat "$dir/flags.txt")): bench rc $?")
      grep -E "^(dash|cuDNN|SDPA)" "$LOG/bench-$name.txt"
      pack
      continue
    fi
    build FLASH_DASH_PASSES=fwd FLASH_DASH_DTYPES=bf16 FLASH_DASH_PREBUILT_DIR="$dir" || { summary+=("$name: build failed"); continue; }
    timeout 120 python3 -m pytest -q -p no:cacheprovider -k dtype0 tests/test_fwd_gpu.py > "$LOG/fwd-$name.log" 2>&1
    summary+=("variant $name ($(cat "$dir/flags.txt")): tests $(tail -1 "$LOG/fwd-$name.log")")
    # shellcheck disable=SC2046,SC2086  # several arguments
    timeout 120 python3 benchmarks/fwd_variants.py "$name" ${FWD_PROBE_ARGS:-} $(cat "$dir/probe_args.txt" 2>/dev/null) --json "$LOG/fwd-$name.json" > "$LOG/probe-$name.txt" 2>&1
    cat "$LOG/probe-$name.txt"
    pack
  done
fi
pack && rm -rf "$LOG"
cat "$OUTDIR/summary.txt"
