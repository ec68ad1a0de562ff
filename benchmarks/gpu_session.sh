#!/usr/bin/env bash
# One GPU-machine call: build, GPU tests, compute-sanitizer, benchmarks (in that order, most important first).
#
#   benchmarks/gpu_session.sh OUTDIR [steps...]
#   steps: build tests sanitize bench (quick) bench-attn bench-block bench-varlen bench-window ncu
#   (default: build tests sanitize bench)
#
# Environment: FLASH_DASH_PREBUILT_DIR links `make kernels` objects instead of compiling (see setup.py);
# TESTS (default: every tests/*_gpu.py and the timeline test), TEST_FILTER (a pytest -k expression for each of them,
# e.g. 192v128), TEST_TIMEOUT (per test file, default 400 s), DEADLINE_S (seconds from the start by which every step must end: each step's limit is cut to what is
# left and a step with under 20 s left is skipped, so a call under the device's 600 s limit still packs its logs;
# default 10000), SANITIZE_PASSES (bwd fwd),
# SANITIZE_TOOLS (racecheck synccheck), SANITIZE_TIMEOUT (per tool, default 450 s: the backward racecheck of hdim
# 64/128/256 takes ~430 s on an H100), SANITIZE_HDIMS (the head dims the sanitizer scripts run, default all),
# ATTN_ARGS / BLOCK_ARGS (passed to the benchmarks), NCU_ARGS / NCU_TAG (the ncu step: research/ncu_attn.py's
# arguments and the name of its text reports), NCU_EXTRA (more ncu options, e.g. "--section MemoryWorkloadAnalysis
# --metrics lts__t_sectors_op_red.sum" for the L2 side of the dQ reduce-adds). FlashAttention-4 rows need FA4 importable: source
# .fa4/pK/stage.sh first (../shared/tools/fa4/prepare.sh). Logs and this call's new results come back in OUTDIR as
# two tars (logs.tar, results.tar) and summary.txt.
set -u -o pipefail
OUTDIR=${1:?usage: gpu_session.sh OUTDIR [steps...]}
shift
STEPS=${*:-build tests sanitize bench}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
LOG="$OUTDIR/logs"
mkdir -p "$LOG"
touch "$LOG/.start"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-16}
has() { [[ " $STEPS " == *" $1 "* ]]; }
summary=()
DEADLINE_S=${DEADLINE_S:-10000}
# step NAME SECONDS CMD...: CMD under `timeout`, its limit cut to what is left before DEADLINE_S; with under 20 s
# left it does not run (a summary line says so) and returns 125.
step() {
  local name=$1 lim=$2 left=$((DEADLINE_S - SECONDS))
  shift 2
  if ((left < 20)); then summary+=("$name: skipped (DEADLINE_S)"); return 125; fi
  timeout $((lim < left ? lim : left)) "$@"
}
# Re-packed after every step so a call cut short by its time limit still brings back what ran.
pack() {
  tar -cf "$OUTDIR/logs.tar" -C "$OUTDIR" logs
  find benchmarks/results -type f -newer "$LOG/.start" -print0 | tar -cf "$OUTDIR/results.tar" --null -T -
  printf '%s\n' "${summary[@]}" > "$OUTDIR/summary.txt"
}

if has build; then
  SECONDS=0
  python3 -m pip install --no-build-isolation --no-deps -v -e . > "$LOG/build.log" 2>&1 \
    || { grep -E "error" "$LOG/build.log" | head -30; pack; exit 1; }
  summary+=("build: ${SECONDS}s")
  pack
fi
if has tests; then
  for t in ${TESTS:-$(cd tests && ls *_gpu.py | sed 's/\.py$//') test_research_bwd_timeline}; do
    step "$t" "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider --maxfail=10 ${TEST_FILTER:+-k "$TEST_FILTER"} \
      "tests/$t.py" > "$LOG/$t.log" 2>&1
    case $? in
      125) ;;  # not run: step() said so
      # pytest's 5: nothing collected, or TEST_FILTER deselected every test; a summary must not read as a pass.
      5) summary+=("$t: NO TEST RAN (pytest rc 5): $(tail -1 "$LOG/$t.log")") ;;
      *) summary+=("$t: $(tail -1 "$LOG/$t.log")") ;;
    esac
    pack
  done
fi
if has sanitize; then
  for pass in ${SANITIZE_PASSES:-bwd fwd}; do
    for tool in ${SANITIZE_TOOLS:-racecheck synccheck}; do
      step "sanitize $pass $tool" "${SANITIZE_TIMEOUT:-450}" compute-sanitizer --tool "$tool" python3 \
        "tests/sanitize_$pass.py" > "$LOG/sanitize-$pass-$tool.log" 2>&1
      rc=$?
      ((rc != 125)) && summary+=("sanitize $pass $tool (rc $rc): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitize-$pass-$tool.log" | tail -1)")
      pack
    done
  done
fi
# run TAG SECONDS CMD...: a step whose output goes to $LOG/TAG.log and whose exit status to the summary.
run() {
  local tag=$1 lim=$2 rc
  shift 2
  step "$tag" "$lim" "$@" > "$LOG/$tag.log" 2>&1
  rc=$?
  ((rc != 125)) && summary+=("$tag rc $rc")
  pack
}
stamp=$(date -u +%F-%H%M)
has bench && run bench-quick 300 env PYTHON=python3 benchmarks/run_bench.sh --quick benchmarks/results
# the whole DASH grid (512..16k); 3 models x 4k..32k
has bench-attn && run bench-attn 420 env PYTHON=python3 benchmarks/run_bench.sh --attn-only benchmarks/results
has bench-block && run bench-block 400 env PYTHON=python3 benchmarks/run_bench.sh --block-only benchmarks/results
# --quick subset of the packs, ours + FA4 + cuDNN (VARLEN_ARGS)
# shellcheck disable=SC2086
has bench-varlen && run bench-varlen 420 python3 benchmarks/bench_varlen.py --quick ${VARLEN_ARGS:-} \
  --json "benchmarks/results/$stamp-varlen.json"
# gpt-oss / Mistral windows and the causal baseline, ours + FA4 (WINDOW_ARGS)
# shellcheck disable=SC2086
has bench-window && run bench-window 420 python3 benchmarks/bench_window.py ${WINDOW_ARGS:-} \
  --json "benchmarks/results/$stamp-window.json"
if has ncu; then  # Nsight Compute side by side (research/ncu_attn.py NCU_ARGS): stall and instruction text, gzipped
  rep="$OUTDIR/ncu-${NCU_TAG:-probe}"
  # shellcheck disable=SC2086
  run "ncu-${NCU_TAG:-probe}" "${NCU_TIMEOUT:-300}" ncu --profile-from-start off --clock-control none \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats \
    --section SchedulerStats --section LaunchStats --section Occupancy ${NCU_EXTRA:-} -f -o "$rep" \
    python3 research/ncu_attn.py ${NCU_ARGS:-}
  if [ -f "$rep.ncu-rep" ]; then
    ncu -i "$rep.ncu-rep" --page details --print-details all 2>&1 | gzip > "$rep-details.txt.gz"
    ncu -i "$rep.ncu-rep" --page raw --csv 2>&1 | gzip > "$rep-raw.csv.gz"
    ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$rep-sass.csv.gz"
    rm -f "$rep.ncu-rep"
  fi
  pack
fi
pack && rm -rf "$LOG"
cat "$OUTDIR/summary.txt"
