"""research/bwd_timeline.py: the summary of dQ-store-warp records (CPU, synthetic records) and, on an sm90 GPU,
recording one backward (production builds must refuse: they record nothing)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from research.bwd_timeline import FIELDS, TILE_FIELDS, record, summarize, tile_phases, tile_transitions


def _synthetic():
    """b=1, h=1, M=2 dQ tiles, N=3 ranks; tile m=1 has no rank 2 (causal-like hole). Clock 1 GHz: cycles = ns."""
    rec = np.full((1, 1, 2, 3, len(FIELDS)), -1, dtype=np.int64)
    #             seen_ns  wait_pred  wait_mma  store  (cta << 32) | step
    rec[0, 0, 0, 0] = (1000, 0, 500, 1000, (0 << 32) | 0)
    rec[0, 0, 0, 1] = (4000, 3000, 0, 1000, (1 << 32) | 1)
    rec[0, 0, 0, 2] = (9000, 1000, 0, 1000, (2 << 32) | 2)
    rec[0, 0, 1, 0] = (2000, 0, 0, 1000, (0 << 32) | 1)
    rec[0, 0, 1, 1] = (3000, 2000, 0, 1000, (1 << 32) | 0)
    return rec


def test_summarize_synthetic_records():
    s = summarize(_synthetic(), clock_ghz=1.0)
    assert s["steps"] == 5
    assert s["wait_pred_us"]["mean"] == pytest.approx((0 + 3 + 1 + 0 + 2) / 5)
    assert s["wait_pred_us"]["median"] == pytest.approx(1.0)
    assert s["store_us"]["median"] == pytest.approx(1.0)
    assert s["wait_pred_first_step_us"]["mean"] == pytest.approx((0 + 2) / 2)  # steps 0: records (0,0) and (1,1)
    assert s["wait_pred_later_steps_us"]["mean"] == pytest.approx((3 + 1 + 0) / 3)
    assert s["wait_pred_share"] == pytest.approx(6 / (6 + 0.5 + 5))
    assert s["cta_wait_pred_ms"]["max"] == pytest.approx(5e-3)  # CTA 1 waited 3 + 2 us
    assert s["rank_gap_us"]["median"] == pytest.approx(3.0)  # gaps 3, 5 (tile 0) and 1 (tile 1)


def test_tile_transitions_separate_steps_from_tile_changes():
    """One CTA runs K/V tile 0 (steps 0-2 into dQ tiles 0-2) then tile 1 (steps 0-1 into dQ tiles 2, 1); its steps
    are ready every 4 us, the change of tile takes 10 us; a second CTA's record must not join its sequence."""
    rec = np.full((1, 1, 3, 3, len(FIELDS)), -1, dtype=np.int64)
    #    dQ tile m, rank     seen_ns  wait_pred  wait_mma  store  (cta << 32) | step
    rec[0, 0, 0, 0] = (1000, 0, 1000, 500, (0 << 32) | 0)   # ready 2 us
    rec[0, 0, 1, 0] = (6000, 0, 0, 500, (0 << 32) | 1)      # ready 6
    rec[0, 0, 2, 0] = (9000, 0, 1000, 500, (0 << 32) | 2)   # ready 10
    rec[0, 0, 2, 1] = (20000, 0, 0, 500, (0 << 32) | 0)     # ready 20: tile gap 10
    rec[0, 0, 1, 1] = (23000, 0, 1000, 500, (0 << 32) | 1)  # ready 24
    rec[0, 0, 0, 1] = (15000, 0, 0, 500, (1 << 32) | 0)     # CTA 1, alone
    t = tile_transitions(rec, clock_ghz=1.0)
    assert t["step_us"]["median"] == pytest.approx(4.0)
    assert t["tile_gap_us"]["median"] == pytest.approx(10.0)
    assert t["tile_overhead_us"] == pytest.approx(6.0)
    assert t["transitions"] == 1
    assert t["gap_share"] == pytest.approx(6.0 / 22.0)  # CTA 0 spans 2..24 us, CTA 1 none


def test_tile_phases_skip_each_ctas_first_tile():
    """CTA 0 runs tiles 0 and 2, CTA 1 tiles 1 and 3; tile 4 ran no step (-1). A CTA's first tile waits for the
    launch, so only tiles 2 and 3 count. Clock 1 GHz: cycles = ns."""
    rec = np.full((5, len(TILE_FIELDS)), -1, dtype=np.int64)
    #        kv_wait_ns  kv_wait  first_q  epilogue  cta  q_wait  do_wait  acquire  loop  steps
    rec[0] = (1000, 9000, 100, 700, 0, 400, 0, 800, 20000, 10)
    rec[2] = (50000, 2000, 300, 900, 0, 600, 0, 1200, 24000, 10)
    rec[1] = (1200, 8000, 100, 800, 1, 200, 100, 400, 8000, 4)
    rec[3] = (52000, 4000, 500, 1100, 1, 2000, 100, 0, 10000, 4)
    p = tile_phases(rec, clock_ghz=1.0)
    assert p["tiles"] == 2
    assert p["kv_wait_us"]["median"] == pytest.approx(3.0)
    assert p["first_q_us"]["median"] == pytest.approx(0.4)
    assert p["epilogue_us"]["median"] == pytest.approx(1.0)
    # Spans 49 + 50.8 us from first to last tile start; the changes: tiles 0/1's epilogues and tiles 2/3's waits.
    assert p["share"] == pytest.approx((0.7 + 0.8 + 2.0 + 0.3 + 4.0 + 0.5) / (49.0 + 50.8))
    # Per step, over every tile that ran one (first tiles included): tiles' sums / their steps, in us.
    assert p["step_us"]["median"] == pytest.approx(np.median([2.0, 2.4, 2.0, 2.5]))
    assert p["q_wait_us"]["mean"] == pytest.approx((0.04 + 0.06 + 0.05 + 0.5) / 4)
    assert p["do_wait_us"]["median"] == pytest.approx(0.0125)
    assert p["acquire_us"]["median"] == pytest.approx(np.median([0.08, 0.12, 0.1, 0.0]))
    with pytest.raises(ValueError, match="tile records must have shape"):
        tile_phases(np.zeros((3, 4)))


def test_summarize_rejects_bad_shapes():
    with pytest.raises(ValueError, match="timeline must have shape"):
        summarize(np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="timeline must have shape"):
        tile_transitions(np.zeros((2, 3, 4)))


@pytest.mark.gpu
def test_record_on_gpu():
    import flash_attn_dash

    if not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and flash_attn_dash.kernels_available()):
        pytest.skip("needs an sm90 GPU and the kernels")
    from flash_attn_dash.ops import fwd

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(2, 1000, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = fwd(q, k, v, 128 ** -0.5, True, 0)
    try:
        tl = record(dout, q, k, v, out, lse, causal=True, schedule="descending")
    except RuntimeError as e:  # production build: the kernels ignore the buffer
        assert "FLASH_DASH_BWD_TIMELINE" in str(e)
        return
    m_tiles, n_tiles = tl.shape[2], tl.shape[3]
    valid = tl[..., 4] >= 0
    # Causal, sq == sk, 64x128 tiles: dQ tile m receives one contribution per K/V tile n <= m // 2.
    expect = torch.tensor([[min(m // 2 + 1, n_tiles) > r for r in range(n_tiles)] for m in range(m_tiles)],
                          device=tl.device)
    assert torch.equal(valid, expect.expand_as(valid))
    assert bool((tl[..., 1:4][valid] >= 0).all())
    s = summarize(tl)
    assert s["steps"] == int(valid.sum())
    # Every K/V tile has one step 0; a CTA's tiles follow each other, so transitions = tiles - CTAs that ran one.
    packed = tl[..., 4][valid]
    tiles, ctas = int(((packed & 0xFFFFFFFF) == 0).sum()), int(torch.unique(packed >> 32).numel())
    assert tile_transitions(tl)["transitions"] == tiles - ctas
    # The MMA warpgroups' tile records: one per K/V tile that ran a step, in the CTAs that ran them.
    _, tile_rec = record(dout, q, k, v, out, lse, causal=True, schedule="descending", with_tiles=True)
    ran = tile_rec[:, 0] >= 0
    assert int(ran.sum()) == tiles
    assert bool((tile_rec[ran][:, 1:4] >= 0).all())
    # The step loop's waits fit in it, and its steps are the tile's (one per dQ record of its K/V tile).
    assert bool((tile_rec[ran][:, 5:9] >= 0).all())
    assert bool((tile_rec[ran][:, 5:8].sum(dim=1) <= tile_rec[ran][:, 8]).all())
    assert int(tile_rec[ran][:, 9].sum()) == int(valid.sum())
    assert set(tile_rec[ran][:, 4].tolist()) == set((packed >> 32).tolist())
