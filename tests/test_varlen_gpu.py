"""Deterministic varlen attention on the GPU: every packed sequence gets the bits of its own dense call, whatever it
is packed with.

The CUDA cases are marked ``gpu`` (they skip without an sm90 GPU and the kernels). The same assertions also run on
CPU tensors, on short sequences, where the reference runs: that keeps the tests themselves checked on every machine.
"""
import re

import pytest
import torch
from varlen_packs import Pack, cu_seqlens, make_pack

from flash_attn_dash import checks, flash_attn_func, flash_attn_varlen_func, varlen_cuda, varlen_schedule_used

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
LONGEST = {"cpu": 24, "cuda": 1100}  # longest sequence of a random pack


def _random_lengths(seed: int, count: int, longest: int, same_lengths: bool) -> tuple[list[int], list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    lens_q[:3] = [0, 1, longest]  # always an empty, a length-1 and a long sequence
    if same_lengths:
        return lens_q, lens_q
    lens_k = torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    lens_k[3] = 0  # queries without keys
    return lens_q, lens_k


def _varlen_results(pack: Pack, dout: torch.Tensor, causal: bool, sm_margin: int = 0):
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), causal=causal, deterministic=True,
                                      sm_margin=sm_margin, return_lse=True)
    return (out, lse, *torch.autograd.grad(out, (pack.q, pack.k, pack.v), dout))


def _sequence_bits(results, rows_q: slice, rows_k: slice):
    """One sequence's rows of (out, lse, dq, dk, dv)."""
    out, lse, dq, dk, dv = results
    return out[rows_q], lse[:, rows_q], dq[rows_q], dk[rows_k], dv[rows_k]


def _assert_bitwise(got, want, what: str):
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and torch.equal(g, w), f"{what}: {name} differs"


@pytest.mark.parametrize("heads,heads_k", [(4, 4), (6, 2)], ids=["MHA", "GQA"])
@pytest.mark.parametrize("same_lengths", [True, False], ids=["sq=sk", "sq!=sk"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_varlen_equals_dense_calls_bitwise(device, head_dim, causal, same_lengths, heads, heads_k):
    lens_q, lens_k = _random_lengths(head_dim + causal, 7, LONGEST[device], same_lengths)
    pack = make_pack(lens_q, lens_k, heads, heads_k, head_dim, torch.bfloat16, device, seed=head_dim)
    dout = torch.randn(pack.q.shape, generator=torch.Generator().manual_seed(1)).to(pack.q)
    results = _varlen_results(pack, dout, causal)
    schedules = varlen_schedule_used(pack.q, pack.k, **pack.args(), causal=causal)
    for i, ((rows_q, rows_k), schedule) in enumerate(zip(pack.spans(), schedules)):
        got = _sequence_bits(results, rows_q, rows_k)
        if schedule is None:  # no work: zero rows, lse -inf, zero gradients
            assert torch.all(got[1] == float("-inf")), f"sequence {i}: lse"
            assert all(torch.all(t == 0) for t in got[:1] + got[2:]), f"sequence {i}: zeros"
            continue
        # the contract's order: launch.varlen_request's (diagonal on causal packs at hdim 64, else descending)
        assert schedule == ("diagonal" if causal and head_dim == 64 else "descending")
        leaves = [t.detach()[rows].unsqueeze(0).clone().requires_grad_()
                  for t, rows in ((pack.q, rows_q), (pack.k, rows_k), (pack.v, rows_k))]
        o, lse = flash_attn_func(*leaves, causal=causal, deterministic=True, schedule=schedule, return_lse=True)
        grads = torch.autograd.grad(o, leaves, dout[rows_q].unsqueeze(0))
        _assert_bitwise(got, (o[0], lse[0], *(g[0] for g in grads)), f"sequence {i} ({rows_q}, {rows_k})")


def _pack_around(doc: Pack, before: list[int], after: list[int], seed: int) -> tuple[Pack, slice, slice]:
    """``doc`` (one sequence) between fresh sequences of the lengths ``before`` and ``after`` (same for q and k);
    returns the pack and the doc's rows."""
    h, hk, d = doc.q.shape[1], doc.k.shape[1], doc.q.shape[2]
    head = make_pack(before, before, h, hk, d, doc.q.dtype, doc.q.device.type, seed)
    tail = make_pack(after, after, h, hk, d, doc.q.dtype, doc.q.device.type, seed + 1)
    q, k, v = (torch.cat([a.detach(), b.detach(), c.detach()]).requires_grad_()
               for a, b, c in zip((head.q, head.k, head.v), (doc.q, doc.k, doc.v), (tail.q, tail.k, tail.v)))
    offset_q, offset_k = sum(before), sum(before)
    pack = Pack(q, k, v, before + doc.lens_q + after, before + doc.lens_k + after)
    return pack, slice(offset_q, offset_q + doc.lens_q[0]), slice(offset_k, offset_k + doc.lens_k[0])


@pytest.mark.parametrize("heads,heads_k", [(4, 4), (8, 2)], ids=["MHA", "GQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("device", DEVICES)
def test_a_document_gets_the_same_bits_in_any_pack(device, head_dim, causal, heads, heads_k):
    """The portability contract: same bits at another position, among other and more sequences, with another
    sm_margin (so another grid)."""
    longest = LONGEST[device]
    doc = make_pack([longest - 3], [longest - 3], heads, heads_k, head_dim, torch.bfloat16, device, seed=5)
    dout = torch.randn(doc.q.shape, generator=torch.Generator().manual_seed(2)).to(doc.q)
    bits = []
    for before, after, sm_margin in (([], [longest // 3, 7], 0), ([5, 0, longest], [1], 0),
                                     ([5, 0, longest], [1], 16)):
        pack, rows_q, rows_k = _pack_around(doc, before, after, seed=len(before))
        pack_dout = torch.zeros_like(pack.q)
        pack_dout[rows_q] = dout
        bits.append(_sequence_bits(_varlen_results(pack, pack_dout, causal, sm_margin), rows_q, rows_k))
    for other, what in zip(bits[1:], ("another pack and position", "another sm_margin")):
        _assert_bitwise(other, bits[0], what)
    assert bits[0][0].abs().sum() > 0 and bits[0][3].abs().sum() > 0


@pytest.mark.gpu
def test_cuda_values_are_checked_on_the_host_copy(monkeypatch):
    """The per-sequence path reads the offsets to the host anyway: it checks them there, before any launch."""
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", False)
    pack = make_pack([3, 4, 2], [5, 4, 1], head_dim=64, dtype=torch.bfloat16, device="cuda")
    args = pack.args()
    bad = {
        "cu_seqlens_q": (torch.tensor([1, 3, 7, 9], dtype=torch.int32, device="cuda"),
                         r"cu_seqlens_q\[0\] must be 0"),
        "cu_seqlens_k": (torch.tensor([0, 5, 9, 9], dtype=torch.int32, device="cuda"),
                         r"cu_seqlens_k\[-1\] must equal k.shape\[0\] = 10"),
        "max_seqlen_q": (3, "max_seqlen_q = 3 must bound every sequence's length, but sequence 1 has 4 tokens"),
        "seqused_k": (torch.tensor([1, 5, 1], dtype=torch.int32, device="cuda"), r"seqused_k\[1\] must be in \[0, 4\]"),
    }
    for name, (value, match) in bad.items():
        with pytest.raises(ValueError, match=match):
            flash_attn_varlen_func(pack.q, pack.k, pack.v, **{**args, name: value})
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be on q's device \(cuda:0\), got cpu"):
        flash_attn_varlen_func(pack.q, pack.k, pack.v, **{**args, "cu_seqlens_q": args["cu_seqlens_q"].cpu()})
    with pytest.raises(ValueError, match="head_dim must be one of " + re.escape(str(checks.KERNEL_HEAD_DIMS))):
        q = torch.zeros(9, 4, 80, dtype=torch.bfloat16, device="cuda")
        flash_attn_varlen_func(q, q[:, :2], q[:, :2], args["cu_seqlens_q"], args["cu_seqlens_q"], 4, 4)


@pytest.mark.gpu
def test_cuda_values_on_the_kernel_path_are_checked_on_the_device():
    """The kernel path reads no offsets on the host (no sync): a bad value fills out with NaN, and the next varlen
    call on the device raises it, naming the argument (and the sequence)."""
    pack = make_pack([3, 4, 2], [5, 4, 1], head_dim=64, dtype=torch.bfloat16, device="cuda")
    args = pack.args()
    bad = {
        "cu_seqlens_q": (torch.tensor([1, 3, 7, 9], dtype=torch.int32, device="cuda"),
                         r"cu_seqlens_q\[0\] must be 0"),
        "cu_seqlens_k": (torch.tensor([0, 5, 9, 9], dtype=torch.int32, device="cuda"),
                         r"cu_seqlens_k\[-1\] must equal total_k = k.shape\[0\]"),
        "max_seqlen_q": (3, r"max_seqlen_q must be >= every sequence's \(used\) query length; sequence 1 is longer"),
        "seqused_k": (torch.tensor([1, 5, 1], dtype=torch.int32, device="cuda"), r"seqused_k\[1\] must be in \[0, "),
    }
    for name, (value, match) in bad.items():
        out = flash_attn_varlen_func(pack.q, pack.k, pack.v, **{**args, name: value})
        torch.cuda.synchronize()
        assert torch.isnan(out).all(), name
        with pytest.raises(ValueError, match=match):
            flash_attn_varlen_func(pack.q, pack.k, pack.v, **args)
    good = flash_attn_varlen_func(pack.q, pack.k, pack.v, **args)  # the error was raised once
    assert torch.isfinite(good).all()


@pytest.mark.gpu
def test_strided_views_of_a_packed_qkv_give_the_contiguous_bits():
    total, heads, d = 900, 4, 128
    qkv = torch.randn(total, 3, heads, d, device="cuda", dtype=torch.bfloat16)
    cu = cu_seqlens([400, 0, 1, 499], "cuda")
    args = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=499, max_seqlen_k=499)
    strided = [qkv[:, i].requires_grad_() for i in range(3)]  # row stride 3 * heads * d
    dense = [t.detach().contiguous().requires_grad_() for t in strided]
    dout = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16)
    results = []
    for leaves in (strided, dense):
        out = flash_attn_varlen_func(*leaves, **args, causal=True, deterministic=True)
        results.append((out, *torch.autograd.grad(out, leaves, dout)))
    for got, want in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.gpu
def test_torch_compile_fullgraph_on_gpu():
    torch._dynamo.reset()
    pack = make_pack([300, 0, 77, 512], [280, 5, 77, 512], 4, 2, 64, torch.bfloat16, "cuda")
    args = pack.args()

    def loss(q, k, v):
        return flash_attn_varlen_func(q, k, v, **args, causal=True, deterministic=True).float().square().sum()

    got = torch.autograd.grad(torch.compile(loss, fullgraph=True)(pack.q, pack.k, pack.v), (pack.q, pack.k, pack.v))
    want = torch.autograd.grad(loss(pack.q, pack.k, pack.v), (pack.q, pack.k, pack.v))
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_all_sequences_empty_on_gpu():
    pack = make_pack([0, 3, 0], [2, 0, 0], 4, 4, 64, torch.bfloat16, "cuda")
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), causal=True, return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (pack.q, pack.k, pack.v), torch.ones_like(out))
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    assert torch.all(dq == 0) and torch.all(dk == 0) and torch.all(dv == 0)
