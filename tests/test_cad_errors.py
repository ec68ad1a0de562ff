"""cad_attn_func rejects bad input with named errors on every rank, before any data moves, and never hangs."""
from __future__ import annotations

import math

import pytest
import torch

from flash_attn_dash.cad import cad_attn_func, gather_doc_lens, plan_cad
from flash_attn_dash.cad.spawn import RankError, run_gloo

DOC_LENS = [[200, 56], [300]]
DIMS = dict(heads=2, heads_kv=1, head_dim=8, dtype_bytes=4)


def rank_inputs(rank: int, lens=None):
    lens = DOC_LENS[rank] if lens is None else lens
    g = torch.Generator().manual_seed(rank)
    total = sum(lens)
    q = torch.randn(total, 2, 8, generator=g)
    k, v = torch.randn(total, 1, 8, generator=g), torch.randn(total, 1, 8, generator=g)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    return q, k, v, cu


def scenario(name: str, rank: int):
    """(q, k, v, cu_seqlens, keyword arguments) of one scenario on ``rank``."""
    plan = plan_cad(DOC_LENS, 128, 0.0, **DIMS)
    q, k, v, cu = rank_inputs(rank)
    kwargs = dict(plan=plan)
    if name == "cu_seqlens_vs_plan" and rank == 0:
        cu = torch.tensor([0, 56, 256], dtype=torch.int32)  # right count and total, wrong documents
    elif name == "cu_seqlens_count" and rank == 1:
        cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    elif name == "cu_seqlens_vs_tensor" and rank == 0:
        q, k, v = q[:-1], k[:-1], v[:-1]
    elif name == "cu_seqlens_dtype":
        cu = cu.long()
    elif name == "other_world_size":
        kwargs["plan"] = plan_cad(DOC_LENS + [[128]], 128, 0.0, **DIMS)
    elif name == "fingerprint_mismatch":
        kwargs["plan"] = plan_cad(DOC_LENS, 128, 0.0 if rank == 0 else math.inf, **DIMS)
    elif name == "causal_vs_plan":
        kwargs["causal"] = False
    elif name == "heads_vs_plan" and rank == 0:
        q = q.repeat(1, 2, 1)
    elif name == "dtype_vs_plan":
        q, k, v = q.double(), k.double(), v.double()
    elif name == "grad_mode_mismatch" and rank == 1:
        q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    elif name == "not_a_plan":
        kwargs["plan"] = DOC_LENS
    elif name == "bad_scale":
        kwargs["softmax_scale"] = float("nan")
    return q, k, v, cu, kwargs


# name -> (error type on the rank(s) at fault, message there, ranks at fault; the others get RuntimeError)
SCENARIOS = {
    "cu_seqlens_vs_plan": ("ValueError", "cu_seqlens gives document lengths [56, 200] on rank 0, but the plan "
                                         "has [200, 56]", [0]),
    "cu_seqlens_count": ("ValueError", "cu_seqlens must have 2 entries: the plan has 1 documents on rank 1", [1]),
    "cu_seqlens_vs_tensor": ("ValueError", "cu_seqlens must run from 0 to q.shape[0] = 255", [0]),
    "cu_seqlens_dtype": ("TypeError", "cu_seqlens must be a 1-D int32 tensor", [0, 1]),
    "other_world_size": ("ValueError", "plan was built for world size 3, but the group has 2 ranks", [0, 1]),
    "fingerprint_mismatch": ("RuntimeError", "the plan (fingerprint) differs across the ranks", [0, 1]),
    "causal_vs_plan": ("ValueError", "causal=False, but the plan was built with causal=True", [0, 1]),
    "heads_vs_plan": ("ValueError", "q.shape must be (total_tokens, 2, 8) as planned", [0]),
    "dtype_vs_plan": ("ValueError", "has 8 bytes per element, but the plan was built with dtype_bytes=4", [0, 1]),
    "grad_mode_mismatch": ("RuntimeError", "the grad mode (some ranks need a backward, others not) differs", [0, 1]),
    "not_a_plan": ("TypeError", "plan must be a CADPlan or CADPingPongPlan", [0, 1]),
    "bad_scale": ("ValueError", "softmax_scale must be a finite float or None", [0, 1]),
}


def error_worker(rank: int, world: int) -> dict[str, tuple[str, str] | None]:
    seen = {}
    for name in SCENARIOS:
        q, k, v, cu, kwargs = scenario(name, rank)
        try:
            cad_attn_func(q, k, v, cu, **kwargs)
            seen[name] = None
        except (TypeError, ValueError, RuntimeError) as exc:
            seen[name] = (type(exc).__name__, str(exc))
    # The group is still usable after every rejection: a good call goes through and is correct.
    q, k, v, cu = rank_inputs(rank)
    assert gather_doc_lens(cu) == DOC_LENS
    out = cad_attn_func(q, k, v, cu, plan=plan_cad(gather_doc_lens(cu), 128, 0.0, **DIMS))
    seen["good_call_after"] = ("ok", str(all(torch.equal(out[a:b], torch.ops.flash_attn_dash.fwd(
        q[None, a:b], k[None, a:b], v[None, a:b], 8 ** -0.5, True, 0)[0][0]) for a, b in zip(cu[:-1], cu[1:]))))
    return seen


@pytest.fixture(scope="module")
def seen():
    ranks = run_gloo(error_worker, 2, timeout_s=120)  # a hang fails here with TimeoutError
    for r in ranks:
        assert not isinstance(r, RankError), r.traceback
    return ranks


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_named_error_on_every_rank(seen, name):
    kind, message, at_fault = SCENARIOS[name]
    for rank, errors in enumerate(seen):
        got = errors[name]
        assert got is not None, f"{name}: rank {rank} raised nothing"
        if rank in at_fault:
            assert got[0] == kind and message in got[1], (rank, got)
        else:
            assert got[0] == "RuntimeError" and f"rank(s) {at_fault} of the group rejected" in got[1], (rank, got)


def test_group_still_works_after_rejections(seen):
    assert all(errors["good_call_after"] == ("ok", "True") for errors in seen)


def test_without_a_process_group():
    q, k, v, cu = rank_inputs(0)
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        cad_attn_func(q, k, v, cu, plan=plan_cad(DOC_LENS, 128, **DIMS))


def test_watchdog_turns_a_hang_into_an_error():
    with pytest.raises(TimeoutError, match="did not finish in 3 s"):
        run_gloo(hang_worker, 2, timeout_s=3)


def hang_worker(rank: int, world: int) -> None:
    if rank == 0:  # rank 1 never joins: without the watchdog this would block forever
        torch.distributed.barrier()
    else:
        import time
        time.sleep(60)

