"""flash_attn_varlen_func on CPU tensors equals attention_ref run on each packed sequence alone."""
import pytest
import torch
from varlen_packs import make_pack, per_sequence_reference

from flash_attn_dash import flash_attn_func, flash_attn_varlen_func

PACKS = {
    # query and key lengths differ per sequence; empty queries, empty keys, length-1 sequences
    "mixed": ([5, 0, 1, 9, 3, 2], [7, 4, 1, 2, 0, 2]),
    "one_long_many_short": ([48, 1, 2, 1, 3, 1, 1, 2], [40, 1, 3, 1, 2, 1, 5, 2]),
    "single": ([13], [13]),
}


def _run(pack, causal, dout, **kwargs):
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), causal=causal, return_lse=True,
                                      **kwargs)
    return (out, lse, *torch.autograd.grad(out, (pack.q, pack.k, pack.v), dout))


def _assert_matches_reference(pack, causal, **kwargs):
    dout = torch.randn(pack.q.shape, generator=torch.Generator().manual_seed(7)).to(pack.q.dtype)
    got = _run(pack, causal, dout, **kwargs)
    want = per_sequence_reference(pack, dout, causal, kwargs.get("softmax_scale"))
    tol = {"atol": 1e-5, "rtol": 1e-4} if pack.q.dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-10}
    assert got[1].dtype == torch.float32 and got[1].shape == (pack.q.shape[1], pack.q.shape[0])
    torch.testing.assert_close(got[1].double(), want[1], atol=1e-5, rtol=1e-5)  # lse is fp32 for every dtype
    for name, g, w in zip(("out", "dq", "dk", "dv"), (got[0], *got[2:]), (want[0], *want[2:5])):
        assert g.dtype == pack.q.dtype, name
        torch.testing.assert_close(g, w, **tol, msg=lambda m, name=name: f"{name}: {m}")
    return got


@pytest.mark.parametrize("heads,heads_k", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("pack_name", PACKS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_matches_per_sequence_reference(dtype, causal, pack_name, heads, heads_k):
    lens_q, lens_k = PACKS[pack_name]
    _assert_matches_reference(make_pack(lens_q, lens_k, heads, heads_k, dtype=dtype), causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqused_ignores_the_rest_of_each_sequence(causal):
    # used counts of 0, 1, all and some; causal aligns on the used lengths
    pack = make_pack([6, 4, 5, 3], [5, 7, 2, 4], used_q=[4, 0, 5, 1], used_k=[5, 3, 1, 0], dtype=torch.float64)
    out, lse, dq, dk, dv = _assert_matches_reference(pack, causal)
    ignored_q = torch.ones(pack.q.shape[0], dtype=torch.bool)
    ignored_k = torch.ones(pack.k.shape[0], dtype=torch.bool)
    for rows_q, rows_k in pack.spans():
        ignored_q[rows_q] = False
        ignored_k[rows_k] = False
    assert ignored_q.sum() == 8 and ignored_k.sum() == 9
    assert torch.all(out[ignored_q] == 0) and torch.all(dq[ignored_q] == 0)
    assert torch.all(lse[:, ignored_q] == float("-inf"))
    assert torch.all(dk[ignored_k] == 0) and torch.all(dv[ignored_k] == 0)


def test_seqused_on_one_side_only():
    _assert_matches_reference(make_pack([3, 5], [4, 6], used_k=[2, 6]), True)
    _assert_matches_reference(make_pack([3, 5], [4, 6], used_q=[3, 1]), True)


def test_sequences_without_keys_or_queries_give_zero_rows_and_minus_inf_lse():
    pack = make_pack([3, 0, 2], [0, 4, 3])
    dout = torch.randn(pack.q.shape)
    out, lse, dq, dk, dv = _run(pack, False, dout)
    assert torch.all(out[:3] == 0) and torch.all(lse[:, :3] == float("-inf")) and torch.all(dq[:3] == 0)
    assert torch.all(dk[:4] == 0) and torch.all(dv[:4] == 0)  # keys of the sequence without queries
    assert torch.isfinite(lse[:, 3:]).all() and out[3:].abs().sum() > 0 and dk[4:].abs().sum() > 0


def test_causal_rows_before_the_first_visible_key_are_empty():
    # 5 queries on 2 keys, aligned bottom-right: the first 3 rows see no key
    pack = make_pack([5], [2])
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), causal=True, return_lse=True)
    assert torch.all(out[:3] == 0) and torch.all(lse[:, :3] == float("-inf")) and torch.isfinite(lse[:, 3:]).all()


def test_softmax_scale_and_default():
    pack = make_pack([4, 6], [5, 3], dtype=torch.float64)
    _assert_matches_reference(pack, True, softmax_scale=0.3)
    scaled = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), softmax_scale=16 ** -0.5)
    torch.testing.assert_close(scaled, flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args()), atol=0, rtol=0)


def test_loose_max_seqlen_changes_nothing():
    pack = make_pack([4, 6], [5, 3])
    args = pack.args()
    tight = flash_attn_varlen_func(pack.q, pack.k, pack.v, **args)
    args.update(max_seqlen_q=100, max_seqlen_k=100)
    assert torch.equal(flash_attn_varlen_func(pack.q, pack.k, pack.v, **args), tight)


def test_empty_batch():
    pack = make_pack([], [])
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), return_lse=True)
    assert out.shape == (0, 4, 16) and lse.shape == (4, 0)


def test_gradcheck_fp64():
    pack = make_pack([3, 0, 2], [2, 1, 4], heads=2, heads_k=1, head_dim=4, dtype=torch.float64)
    args = pack.args()
    torch.autograd.gradcheck(
        lambda q, k, v: flash_attn_varlen_func(q, k, v, **args, causal=True, deterministic=True),
        (pack.q, pack.k, pack.v))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_bf16_equals_dense_calls_per_sequence(causal):
    """The CPU path is the dense CPU path run per sequence, to the bit (the contract the GPU tests check)."""
    pack = make_pack([7, 1, 0, 12], [9, 3, 2, 12], dtype=torch.bfloat16)
    dout = torch.randn(pack.q.shape).bfloat16()
    out, lse, dq, dk, dv = _run(pack, causal, dout, deterministic=True)
    for rows_q, rows_k in pack.spans():
        if rows_q.stop == rows_q.start:
            continue
        leaves = [t.detach()[rows].unsqueeze(0).requires_grad_() for t, rows in ((pack.q, rows_q), (pack.k, rows_k),
                                                                                (pack.v, rows_k))]
        o, l = flash_attn_func(*leaves, causal=causal, deterministic=True, return_lse=True)
        grads = torch.autograd.grad(o, leaves, dout[rows_q].unsqueeze(0))
        assert torch.equal(out[rows_q], o[0]) and torch.equal(lse[:, rows_q], l[0])
        for g, rows, want in zip((dq, dk, dv), (rows_q, rows_k, rows_k), grads):
            assert torch.equal(g[rows], want[0])
