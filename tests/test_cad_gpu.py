"""CAD on the sm90 kernels (one H200): chunked calls against whole-document calls, and plan invariance with
several processes sharing the GPU over gloo (CUDA tensors staged through host memory), under a watchdog."""
from __future__ import annotations

import pytest
import torch

from flash_attn_dash.cad import cad_attn_func, fold_partials, plan_cad, plan_cad_pingpong
from flash_attn_dash.cad.server import SCHEDULE, backward_tasks, forward_tasks
from flash_attn_dash.cad.spawn import RankError, run_gloo

pytestmark = pytest.mark.gpu

SHAPES = [(64, 4, 4), (64, 8, 2), (128, 4, 4), (128, 8, 1)]  # (head_dim, heads, heads_kv): MHA, GQA, MQA


def doc_tensors(seed: int, length: int, heads: int, heads_kv: int, head_dim: int, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, length, h, head_dim, generator=g).to(device, torch.bfloat16)
            for h in (heads, heads_kv, heads_kv, heads)]


def chunks(length: int, chunk: int):
    return [(a, min(a + chunk, length)) for a in range(0, length, chunk)]


@pytest.mark.parametrize("head_dim, heads, heads_kv", SHAPES)
@pytest.mark.parametrize("length, chunk", [(1000, 256), (3000, 1024), (2048, 128)])
def test_chunk_calls_match_the_whole_document_bitwise(head_dim, heads, heads_kv, length, chunk):
    """O, LSE and dQ of a chunk [a, e) against the prefix [0, e) equal rows [a, e) of the whole-document call."""
    q, k, v, dout = doc_tensors(length, length, heads, heads_kv, head_dim)
    scale = head_dim ** -0.5
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, scale, True, 0)
    dq, dk, dv, _ = torch.ops.flash_attn_dash.bwd(dout, q, k, v, out, lse, scale, True, True, SCHEDULE, 0)
    partials = []
    for a, e in chunks(length, chunk):
        for margin in (0, 16):
            o_c, lse_c = torch.ops.flash_attn_dash.fwd(q[:, a:e], k[:, :e], v[:, :e], scale, True, margin)
            assert torch.equal(o_c, out[:, a:e]), f"O rows [{a}, {e}) sm_margin {margin}"
            assert torch.equal(lse_c, lse[:, :, a:e]), f"LSE rows [{a}, {e}) sm_margin {margin}"
            dq_c, dk_c, dv_c, _ = torch.ops.flash_attn_dash.bwd(
                dout[:, a:e].contiguous(), q[:, a:e].contiguous(), k[:, :e].contiguous(), v[:, :e].contiguous(),
                o_c, lse_c, scale, True, True, SCHEDULE, margin)
            assert torch.equal(dq_c, dq[:, a:e]), f"dQ rows [{a}, {e}) sm_margin {margin}"
        partials.append(torch.stack([dk_c[0], dv_c[0]], 1))
    # dK/dV are folded from bf16 chunk partials: close to the whole-document call, not bitwise (design/cad.md).
    folded = fold_partials(partials, length, torch.bfloat16).float()
    for got, ref in ((folded[:, 0], dk[0].float()), (folded[:, 1], dv[0].float())):
        assert (got - ref).norm() <= 1e-2 * ref.norm()


@pytest.mark.parametrize("head_dim, heads, heads_kv", SHAPES[1::2])
def test_server_tasks_on_the_kernels_match_direct_calls(head_dim, heads, heads_kv):
    """forward_tasks/backward_tasks over a two-document W=1 plan give the direct per-chunk results."""
    lengths = [1000, 700]
    plan = plan_cad([lengths], 256, heads=heads, heads_kv=heads_kv, head_dim=head_dim)
    docs = [doc_tensors(i, n, heads, heads_kv, head_dim) for i, n in enumerate(lengths)]
    q, k, v, dout = (torch.cat([d[j][0] for d in docs]) for j in range(4))
    scale = head_dim ** -0.5
    out, lses = forward_tasks(plan.tasks[0], q, k, v, scale, True, 0)
    dq, partials = backward_tasks(plan.tasks[0], dout, q, k, v, out, lses, scale, True, True, 0)
    base = [0, lengths[0]]
    for t in plan.tasks[0]:
        qd, kd, vd, dod = docs[t.doc]
        o_c, lse_c = torch.ops.flash_attn_dash.fwd(qd[:, t.start:t.end], kd[:, :t.end], vd[:, :t.end], scale, True, 0)
        rows = slice(base[t.doc] + t.start, base[t.doc] + t.end)
        assert torch.equal(out[rows], o_c[0])
        dq_c, dk_c, dv_c, _ = torch.ops.flash_attn_dash.bwd(
            dod[:, t.start:t.end].contiguous(), qd[:, t.start:t.end].contiguous(), kd[:, :t.end].contiguous(),
            vd[:, :t.end].contiguous(), o_c, lse_c, scale, True, True, SCHEDULE, 0)
        assert torch.equal(dq[rows], dq_c[0])
        assert torch.equal(partials[t.partial_offset:t.partial_offset + t.kv_rows, 0], dk_c[0])
        assert torch.equal(partials[t.partial_offset:t.partial_offset + t.kv_rows, 1], dv_c[0])


LENGTHS = (1000, 129, 2300, 640, 77, 1500, 384, 900)
DIMS = dict(heads=8, heads_kv=2, head_dim=128)


def shared_gpu_worker(rank: int, world: int, pingpong: bool) -> dict[int, tuple[torch.Tensor, ...]]:
    torch.cuda.set_device(0)
    ids = [list(range(len(LENGTHS)))[r::world] for r in range(world)]
    planner = plan_cad_pingpong if pingpong else plan_cad
    plan = planner([[LENGTHS[i] for i in r] for r in ids], 256, 0.0, **DIMS)
    mine = [doc_tensors(i, LENGTHS[i], **DIMS) for i in ids[rank]]
    q, k, v, dout = (torch.cat([d[j][0] for d in mine]).requires_grad_(j < 3) for j in range(4))
    cu = [0]
    for i in ids[rank]:
        cu.append(cu[-1] + LENGTHS[i])
    out = cad_attn_func(q, k, v, torch.tensor(cu, dtype=torch.int32, device="cuda"), plan=plan)
    out.backward(dout.detach())
    return {i: tuple(t[a:b].detach().cpu() for t in (out, q.grad, k.grad, v.grad))
            for i, a, b in zip(ids[rank], cu, cu[1:])}


def test_processes_sharing_one_gpu_give_the_same_bits_for_every_world_size():
    seen = {}
    for world, pingpong in ((1, False), (2, False), (3, False), (4, False), (2, True), (4, True)):
        ranks = run_gloo(shared_gpu_worker, world, pingpong, timeout_s=300)  # hang watchdog
        for r in ranks:
            assert not isinstance(r, RankError), r.traceback
        seen[(world, pingpong)] = {doc: t for r in ranks for doc, t in r.items()}
    expect = seen[(1, False)]
    for key, docs in seen.items():
        for doc, tensors in expect.items():
            for label, a, b in zip(("out", "dq", "dk", "dv"), tensors, docs[doc]):
                assert torch.equal(a, b), f"{label} of document {doc} differs at (world, pingpong) = {key}"
