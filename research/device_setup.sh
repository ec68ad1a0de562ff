# Sourced on the GPU machine at the start of a call: `source research/device_setup.sh [PACK.tar.xz ...]`.
# Installs the CUTLASS headers from the carried wheel (`.whl/nvidia_cutlass-*.whl`: pip download --no-deps
# nvidia-cutlass==4.2.0.0 -d .whl on the CPU machine; the GPU machine cannot download) into /tmp/cutlass once per
# machine and puts it on PYTHONPATH, then unpacks each `research/prebuild.sh` pack into /tmp/pb (a pack's folder:
# /tmp/pb/NAME, for FLASH_DASH_PREBUILT_DIR or patch_ab.sh's AB_PREBUILT=/tmp/pb; a slim pack's objects left out are
# copied from the pack it names, which must come in the same call).
if [ ! -d /tmp/cutlass/cutlass_library ]; then
  python3 -m pip install -q --no-deps --target /tmp/cutlass .whl/nvidia_cutlass-*.whl > /tmp/cutlass-install.log 2>&1 \
    || { echo "device_setup: the cutlass wheel did not install"; tail -5 /tmp/cutlass-install.log; }
fi
export PYTHONPATH="/tmp/cutlass${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p /tmp/pb
for _pack in "$@"; do tar -xJf "$_pack" -C /tmp/pb || echo "device_setup: $_pack did not unpack"; done
# A slim pack (prebuild.sh FROM=DIR) names in `from` the pack whose identical objects it left out.
for _from in /tmp/pb/*/from; do
  [ -e "$_from" ] || continue
  for _stamp in "${_from%/from}"/*.digest; do
    _obj=${_stamp%.digest}.o
    [ -e "$_obj" ] || cp "/tmp/pb/$(cat "$_from")/${_obj##*/}" "$_obj" || echo "device_setup: $_obj missing"
  done
done
echo "device_setup: packs in /tmp/pb: $(ls /tmp/pb | tr '\n' ' ')"
# link_pack PACK OUTDIR [HDIMS] [DTYPES]: build the extension (dtypes DTYPES, default bf16; head dims HDIMS, default
# 64,128) linking /tmp/pb/PACK's objects (benchmarks/gpu_session.sh's build into OUTDIR, its log OUTDIR.log); prints
# the build's summary line.
# PACK defaults to the pack the slim packs name (HEAD's, when the call carries patches' slim packs beside it).
link_pack() {
  local pack=${1:-$(cat /tmp/pb/*/from 2>/dev/null | head -1)}
  env FLASH_DASH_DTYPES="${4:-bf16}" FLASH_DASH_HDIMS="${3:-64,128}" FLASH_DASH_PREBUILT_DIR="/tmp/pb/$pack" \
    benchmarks/gpu_session.sh "$2" build > "$2.log" 2>&1
  echo "$pack: $(tail -1 "$2/summary.txt")"
}
# bundle_out DIR: a call brings back at most 8 files from $OUT (more are left out by count), so a step that writes
# many (ncu's reports and per-kernel readings) is packed into DIR.tar, its summary kept beside it as DIR.txt.
bundle_out() {
  [ -d "$1" ] || return 0
  [ -f "$1/summary.txt" ] && cp "$1/summary.txt" "$1.txt"
  tar -cf "$1.tar" -C "$(dirname "$1")" "$(basename "$1")" && rm -rf "$1"
}
# ncu_read TAG ARGS...: Nsight Compute of research/ncu_attn.py ARGS into $OUT/ncu (gpu_session.sh's ncu step, TAG
# naming its reports), each source page read per step by research/ncu_sass.py, the folder bundled as ncu.tar.
ncu_read() {
  local tag=$1 f
  shift
  NCU_TAG=$tag NCU_TIMEOUT=300 NCU_ARGS="$*" benchmarks/gpu_session.sh "$OUT/ncu" ncu > /dev/null 2>&1
  cat "$OUT/ncu/summary.txt"
  for f in "$OUT"/ncu/ncu-*-sass.csv.gz; do
    [ -f "$f" ] && python3 research/ncu_sass.py "$f" --top 12 2>&1 | tee "${f%.csv.gz}.steps.txt" | tail -60
  done
  bundle_out "$OUT/ncu"
}
# ab_patch PATCH: research/patch_ab.sh of PATCH against the installed build into $OUT/ab, within the call's 585 s,
# each variant linking its prebuilt objects from /tmp/pb; the A/B's knobs (AB_*, BENCH_*, SANITIZE_*) come from the
# caller, as assignments before the call: `AB_TESTS="..." ab_patch research/patches/X.patch`.
ab_patch() {
  timeout $((585 - SECONDS)) env AB_PREBUILT=/tmp/pb research/patch_ab.sh "$OUT/ab" "$1" 2>&1 | tail -34
}
