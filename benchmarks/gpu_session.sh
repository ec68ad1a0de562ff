#!/usr/bin/env bash
# One GPU-machine call: build, GPU tests, compute-sanitizer, benchmarks (in that order, most important first).
#
#   benchmarks/gpu_session.sh OUTDIR [steps...]
#   steps: build tests sanitize bench (quick) bench-attn bench-block bench-varlen bench-window ncu
#   (default: build tests sanitize bench)
#
# Environment: FLASH_DASH_PREBUILT_DIR links `make kernels` objects instead of compiling (see setup.py);
# TESTS (default: every tests/*_gpu.py and the timeline test), SANITIZE_PASSES (bwd fwd),
# SANITIZE_TOOLS (racecheck synccheck), SANITIZE_HDIMS (the head dims the sanitizer scripts run, default all),
# ATTN_ARGS / BLOCK_ARGS (passed to the benchmarks), NCU_ARGS / NCU_TAG (the ncu step: research/ncu_attn.py's
# arguments and the name of its text reports). FlashAttention-4 rows need FA4 importable: source
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
    timeout 400 python3 -m pytest -q -p no:cacheprovider --maxfail=10 "tests/$t.py" > "$LOG/$t.log" 2>&1
    summary+=("$t: $(tail -1 "$LOG/$t.log")")
    pack
  done
fi
if has sanitize; then
  for pass in ${SANITIZE_PASSES:-bwd fwd}; do
    for tool in ${SANITIZE_TOOLS:-racecheck synccheck}; do
      timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool "$tool" python3 "tests/sanitize_$pass.py" \
        > "$LOG/sanitize-$pass-$tool.log" 2>&1
      summary+=("sanitize $pass $tool (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/sanitize-$pass-$tool.log" | tail -1)")
      pack
    done
  done
fi
bench() {  # bench TAG SECONDS run_bench.sh-args...: results land in benchmarks/results
  local tag=$1 limit=$2; shift 2
  timeout "$limit" env PYTHON=python3 benchmarks/run_bench.sh "$@" benchmarks/results > "$LOG/$tag.log" 2>&1
  summary+=("$tag rc $?")
  pack
}
has bench && bench bench-quick 300 --quick
has bench-attn && bench bench-attn 420 --attn-only     # the whole DASH grid (512..16k)
has bench-block && bench bench-block 400 --block-only  # 3 models x 4k..32k
if has bench-varlen; then  # --quick subset of the packs, ours + FA4 + cuDNN
  timeout 420 python3 benchmarks/bench_varlen.py --quick ${VARLEN_ARGS:-} \
    --json "benchmarks/results/$(date -u +%F-%H%M)-varlen.json" > "$LOG/bench-varlen.log" 2>&1
  summary+=("bench-varlen rc $?")
  pack
fi
if has bench-window; then  # gpt-oss / Mistral windows and the causal baseline, ours + FA4 (WINDOW_ARGS)
  timeout 420 python3 benchmarks/bench_window.py ${WINDOW_ARGS:-} \
    --json "benchmarks/results/$(date -u +%F-%H%M)-window.json" > "$LOG/bench-window.log" 2>&1
  summary+=("bench-window rc $?")
  pack
fi
if has ncu; then  # Nsight Compute side by side (research/ncu_attn.py NCU_ARGS): stall and instruction text, gzipped
  rep="$OUTDIR/ncu-${NCU_TAG:-probe}"
  timeout "${NCU_TIMEOUT:-300}" ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section InstructionStats --section SchedulerStats \
    --section LaunchStats --section Occupancy -f -o "$rep" python3 research/ncu_attn.py ${NCU_ARGS:-} \
    > "$LOG/ncu-${NCU_TAG:-probe}.log" 2>&1
  summary+=("ncu ${NCU_TAG:-probe} rc $?")
  ncu -i "$rep.ncu-rep" --page details --print-details all 2>&1 | gzip > "$rep-details.txt.gz"
  ncu -i "$rep.ncu-rep" --page raw --csv 2>&1 | gzip > "$rep-raw.csv.gz"
  ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$rep-sass.csv.gz"
  rm -f "$rep.ncu-rep"
  pack
fi
pack && rm -rf "$LOG"
cat "$OUTDIR/summary.txt"
