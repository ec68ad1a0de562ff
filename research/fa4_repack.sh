#!/usr/bin/env bash
# On the CPU machine: re-pack FlashAttention-4's wheels (the parts ../shared/tools/fa4/prepare.sh leaves under
# .fa4/) as one installed site folder compressed with xz, cut in two parts under .fa4x/q0 and .fa4x/q1.
# Wheels are zip (deflate); the unpacked tree under xz is ~2/3 of their size, so FA4 travels in two device calls
# beside prebuilt objects instead of three. Q0_MIB sets the first part's size (default 28: it rides with the cutlass
# wheel and a full object pack); the second part gets the rest.
#
#   research/fa4_repack.sh          # then: call 1 carries .fa4x/q0, call 2 .fa4x/q1, back to back, each
#                                   # command starting `source research/fa4_stage.sh .fa4x/qK;`
set -euo pipefail
Q0_MIB=${Q0_MIB:-28}
root=$(git rev-parse --show-toplevel)
cd "$root"
ls .fa4/p*/part.* > /dev/null || { echo "no .fa4 parts: run ../shared/tools/fa4/prepare.sh first" >&2; exit 1; }
grep -qx '/.fa4x/' .git/info/exclude 2>/dev/null || echo '/.fa4x/' >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat .fa4/p*/part.* | tar -xf - -C "$work"
mkdir -p "$work/site"
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
rm -rf .fa4x && mkdir -p .fa4x
tar -cf - -C "$work" site | xz -9e -T2 > "$work/site.tar.xz"
sha=$(sha256sum "$work/site.tar.xz" | cut -d' ' -f1)
head -c $((Q0_MIB * 1048576)) "$work/site.tar.xz" > "$work/part.0"
tail -c +$((Q0_MIB * 1048576 + 1)) "$work/site.tar.xz" > "$work/part.1"
for k in 0 1; do
  mkdir -p ".fa4x/q$k"
  mv "$work/part.$k" ".fa4x/q$k/"
  printf '2 %s\n' "$sha" > ".fa4x/q$k/manifest"
done
du -sh .fa4x/q*
