"""The backward's two layouts in the variant table (CPU): which entries swap dK/dV and what their tiles must satisfy
(the static_asserts of hopper/bwd/traits.hpp, checked here before any GPU build), the generated translation units,
the launch decisions their tiles lead to, and the refusal of a head dim a build left out."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "hopper"))

import generate  # noqa: E402  (hopper/generate.py)
from host_cpp import build_host_program  # noqa: E402

from flash_attn_dash import checks, launch, variants  # noqa: E402
from flash_attn_dash.schedule.orders import fallback_reason  # noqa: E402
from flash_attn_dash.schedule.tiles import TileGrid  # noqa: E402

LAUNCH_REGS = 65536 // 384 // 8 * 8  # BwdTraits::kLaunchRegs
SMEM_LIMIT = 232448  # common/sm90_limits.hpp kMaxSmemPerBlock


def _bwd_smem_bytes(h: variants.HeadDim) -> int:
    """An estimate of the backward's shared storage (BwdTraits::SharedStorage, whose static_assert is the exact check):
    the 16-bit tiles 1 KB aligned, the fp32 dQ hand-off, LSE / dPsum, 512 B for barriers and the tile ring."""
    t = h.bwd
    tiles = [t.q_stages * t.block_m * h.qk, t.do_stages * t.block_m * h.v, t.block_n * h.qk, t.block_n * h.v,
             2 * t.block_m * t.block_n]  # Q, dO, K, V, the two P/dS buffers
    kb = sum(-(-2 * n // 1024) * 1024 for n in tiles)
    return kb + 4 * t.block_m * h.qk + 4 * t.block_m * (t.q_stages + t.do_stages) + 512


@pytest.mark.parametrize("h", variants.HEAD_DIMS, ids=lambda h: h.tag)
def test_backward_layout_of_each_entry(h):
    """Head dims above 128 swap dK/dV (two 64 x d fp32 accumulators per warpgroup do not fit its registers); the
    swapped layout has one 64-row S GMMA whose keys the warpgroups halve (a multiple of 8 each) and, where the head
    dim is not a multiple of 128, halves of the keys for dK^T/dV^T too; the plain layout splits 128 keys. The V head
    dim (MLA) meets the same bounds."""
    t = h.bwd
    assert t.swap_dkv == (max(h.qk, h.v) > 128)
    for d in (h.qk, h.v):
        assert d % 32 == 0 and d <= (256 if t.swap_dkv else 128)
    if t.swap_dkv:
        assert t.block_m == 64 and t.block_n % 16 == 0
        dkv_n = t.block_n if h.qk % 128 == 0 and h.v % 128 == 0 else t.block_n // 2
        assert dkv_n % 8 == 0
    else:
        assert t.block_n == 128 and t.block_m in (64, 128)
    assert t.q_stages >= 1 and t.do_stages >= 1
    assert (t.producer_regs + 2 * t.mma_regs) * 128 <= LAUNCH_REGS * 384
    assert _bwd_smem_bytes(h) <= SMEM_LIMIT, _bwd_smem_bytes(h)


def test_default_entries_keep_their_generated_units():
    """The default-build entries pass BwdTraits its old six arguments (the new ones at their defaults); the swapped
    ones pass all nine (ten with a V head dim of their own), and their translation units enable the extended GMMA
    shapes their key halves need."""
    units = generate.files()
    for h in variants.HEAD_DIMS:
        t = h.bwd
        text = units[generate.GENERATED / f"bwd_{h.tag}_bf16.cu"]
        six = f"BwdTraits<cutlass::bfloat16_t, {h.qk}, {t.block_m}, {t.block_n}, {t.producer_regs}, {t.mma_regs}"
        if h.v != h.qk:
            assert f"{six}, {t.q_stages}, {t.do_stages}, {str(t.swap_dkv).lower()}, {h.v}>" in text
        elif t.swap_dkv:
            assert f"{six}, {t.q_stages}, {t.do_stages}, true>" in text
        else:
            assert f"{six}>" in text
        extended = "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in text
        assert extended == any(n not in generate.BASE_GMMA_N for n in generate.bwd_gmma_n(h))
    assert generate.bwd_gmma_n(variants.head_dim(256)) == {32, 64, 128}
    assert generate.bwd_gmma_n(variants.head_dim(192)) == {48, 96}
    assert generate.bwd_gmma_n(variants.head_dim(192, 128)) == {48, 96}


@pytest.mark.parametrize("qk", [h.qk for h in variants.HEAD_DIMS if h.bwd.block_n % h.bwd.block_m])
@pytest.mark.parametrize("deterministic", [False, True])
def test_symmetric_shift_falls_back_where_its_pair_step_is_not_whole(qk, deterministic):
    """symmetric_shift pairs tiles n and N-1-n for kBlockN / kBlockM Q tiles per K/V tile; the swapped tiles of
    hdim 192 (64x96) have no whole step, so no kernel instantiates it (variants.SCHEDULES requires) and causal launches
    asking for it, or walking it when not deterministic, run descending."""
    bm, bn = variants.bwd_tile(qk)
    grid = TileGrid("causal", 4096, 4096, bm, bn)
    assert "block_n % block_m" in fallback_reason("symmetric_shift", grid)
    got = launch.bwd_launch(True, qk, 4096, 4096, 2, 8, 132, deterministic, "symmetric_shift")
    assert (got.schedule, got.requested) == ("descending", "symmetric_shift")
    assert "block_n % block_m" in got.fallback
    assert launch.bwd_launch(False, qk, 4096, 4096, 2, 8, 132, deterministic, "shift").schedule == "shift"


VARLEN_ROWS_CPP = r"""
#include <cstdio>
#include "common/varlen.hpp"
int main() { std::printf("%d\n", flash_dash::kVarlenMinRows); }
"""


def test_varlen_tables_are_sized_for_every_block(tmp_path_factory):
    """The binding sizes a pack's tile table for kVarlenMinRows-row blocks: every forward query block and backward key
    block of the table has at least that many rows (the launchers static_assert it too)."""
    exe = build_host_program(tmp_path_factory, "varlen_rows", VARLEN_ROWS_CPP)
    rows = int(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    smallest = min(min(h.bwd.block_n, h.fwd_full.block_m, h.fwd_causal.block_m) for h in variants.HEAD_DIMS)
    assert rows <= smallest


def test_refusal_names_the_built_head_dims_and_the_build(monkeypatch):
    """A table head dim this build lacks: the message lists what was built, says when default builds leave it out,
    and gives the FLASH_DASH_HDIMS build that adds it."""
    msg = checks.not_compiled_message(256, (64, 96, 128))
    assert "head_dim 256 was not compiled into this build (built: 64, 96, 128)" in msg
    assert "FLASH_DASH_HDIMS=64,96,128,256 pip install --no-build-isolation -e ." in msg
    assert "default builds" not in msg  # every entry of the table is in the default build
    assert "(built: none)" in checks.not_compiled_message(192, ())
    monkeypatch.setattr(variants, "HEAD_DIMS", tuple(dataclasses.replace(h, default_build=h.qk != 256)
                                                     for h in variants.HEAD_DIMS))
    assert "default builds leave it out" in checks.not_compiled_message(256, (64, 96, 128))
    assert "default builds" not in checks.not_compiled_message(96, (128,))
