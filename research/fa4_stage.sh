# Sourced on the GPU machine: `source research/fa4_stage.sh [.fa4x/qK]` (parts from research/fa4_repack.sh).
# Keeps this call's part in /tmp/fa4x; once both parts are there, unpacks FlashAttention-4 into /tmp/fa4x/site.
# Whenever FA4 is unpacked (this call or an earlier one on the same machine) it exports PYTHONPATH so that
# `from flash_attn.cute import flash_attn_func` works; returns 1 while a part is missing, 2 on a broken set.
if [ -n "${1:-}" ]; then
  mkdir -p /tmp/fa4x/parts
  for _fa4x_p in "$1"/part.*; do [ -e "/tmp/fa4x/parts/${_fa4x_p##*/}" ] || cp "$_fa4x_p" /tmp/fa4x/parts/; done
  read -r _fa4x_n _fa4x_sha < "$1/manifest"
  if [ ! -d /tmp/fa4x/site/flash_attn ] && [ "$(ls /tmp/fa4x/parts | wc -l)" -ge "$_fa4x_n" ]; then
    if [ "$(cat /tmp/fa4x/parts/part.* | sha256sum | cut -d' ' -f1)" != "$_fa4x_sha" ]; then
      echo "fa4x: parts do not match the manifest: rm -rf /tmp/fa4x and send them again"
      return 2 2>/dev/null || exit 2
    fi
    cat /tmp/fa4x/parts/part.* | xz -d | tar -xf - -C /tmp/fa4x
  fi
fi
if [ ! -d /tmp/fa4x/site/flash_attn ]; then
  echo "fa4x: not unpacked yet (parts here: $(ls /tmp/fa4x/parts 2>/dev/null | tr '\n' ' '))"
  return 1 2>/dev/null || exit 1
fi
# The DSL's .pth file is not read from a plain folder: add its package folder by hand.
export PYTHONPATH="/tmp/fa4x/site:/tmp/fa4x/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
echo "fa4x: $(python3 -c 'import importlib.metadata as m; print("flash-attn-4", m.version("flash-attn-4"))' 2>&1 | tail -1)"
