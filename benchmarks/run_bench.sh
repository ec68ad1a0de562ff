#!/usr/bin/env bash
# Run the flash-attn-dash benchmarks and render them.
#
#   benchmarks/run_bench.sh [--quick] [--attn-only | --block-only] [--name NAME] [OUTDIR]
#
#   full  : bench_attn.py (DASH grid, 24 shapes) + bench_block.py (3 models x 4k..32k)
#   --quick: bench_attn.py --quick (2k/8k, both hdims and masks) + bench_block.py --quick
#            (llama3-8b 8k); targets < 3 minutes on one H200.
#   OUTDIR defaults to benchmarks/results. Files: OUTDIR/<UTC date-time>-<name>.{json,md,png}
#   with name attn / block (suffix -quick, or --name NAME instead of the date-time).
#   Extra arguments: ATTN_ARGS="..." and BLOCK_ARGS="..." environment variables
#   (e.g. ATTN_ARGS="--impl ours,sdpa-cudnn"); PYTHON selects the interpreter.
#
# Exit code: the first non-zero exit code of the benchmarks (2 = no CUDA, 3 = aborted by the
# hang watchdog / broken CUDA context), else that of plot.py. Partial results are still
# rendered.
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python}"
QUICK=0
DO_ATTN=1
DO_BLOCK=1
NAME=""
OUTDIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --attn-only) DO_BLOCK=0 ;;
    --block-only) DO_ATTN=0 ;;
    --name) shift; NAME="${1:?--name needs a value}" ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "run_bench.sh: unknown option $1" >&2; exit 64 ;;
    *) OUTDIR="$1" ;;
  esac
  shift
done
OUTDIR="${OUTDIR:-benchmarks/results}"
mkdir -p "$OUTDIR"
STAMP="${NAME:-$(date -u +%Y-%m-%d-%H%M)}"
SUFFIX=""
QFLAG=""
if [ "$QUICK" = 1 ]; then SUFFIX="-quick"; QFLAG="--quick"; fi
ATTN_JSON="$OUTDIR/$STAMP-attn$SUFFIX.json"
BLOCK_JSON="$OUTDIR/$STAMP-block$SUFFIX.json"
# an in-place build of flash_attn_dash is importable without installation
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GIT_COMMIT="${GIT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"

rc=0
t0=$(date +%s)
note() { echo "=== run_bench.sh [$(( $(date +%s) - t0 ))s] $*"; }

JSONS=()
run_one() {  # run_one SCRIPT JSON EXTRA_ARGS: one benchmark; exit 2 (no CUDA) stops everything
  note "$1 $QFLAG $3 -> $2"
  # shellcheck disable=SC2086
  "$PY" "benchmarks/$1" $QFLAG $3 --json "$2"
  local r=$?
  note "$1 exit code $r"
  if [ "$r" = 2 ]; then exit 2; fi
  [ "$rc" = 0 ] && rc=$r
  [ -f "$2" ] && JSONS+=("$2")
}
[ "$DO_ATTN" = 1 ] && run_one bench_attn.py "$ATTN_JSON" "${ATTN_ARGS:-}"
[ "$DO_BLOCK" = 1 ] && run_one bench_block.py "$BLOCK_JSON" "${BLOCK_ARGS:-}"
if [ "${#JSONS[@]}" = 0 ]; then
  note "no results to plot"
  exit $(( rc == 0 ? 1 : rc ))
fi
note "plot.py ${JSONS[*]}"
"$PY" benchmarks/plot.py "${JSONS[@]}"
r=$?
[ "$rc" = 0 ] && rc=$r
# Markdown last (block first, attention table at the very end)
for j in "${JSONS[@]}"; do
  case "$j" in *-block*) [ -f "${j%.json}.md" ] && { echo; cat "${j%.json}.md"; } ;; esac
done
for j in "${JSONS[@]}"; do
  case "$j" in *-attn*) [ -f "${j%.json}.md" ] && { echo; cat "${j%.json}.md"; } ;; esac
done
note "done, exit code $rc; results in $OUTDIR ($STAMP)"
exit "$rc"
