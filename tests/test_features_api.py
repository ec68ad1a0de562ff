"""window_size, softcap and learnable_sink on every entry point, on the CPU (the reference path): results and
gradients (dsink included) against reference.py, the ops' fakes / opcheck / torch.compile, every validation error,
and the CUDA decision (what the sm90 kernels run or refuse), exercised on argument values and on fake CUDA tensors."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from varlen_packs import cu_seqlens, make_pack, per_sequence_reference

import flash_attn_dash.ops as ops
import flash_attn_dash.varlen_cuda as varlen_cuda
import flash_attn_dash.varlen_per_sequence as per_sequence
from flash_attn_dash import (backward_schedule_used, features, flash_attn_func, flash_attn_kvpacked_func,
                             flash_attn_qkvpacked_func, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                             flash_attn_varlen_qkvpacked_func, variants, varlen_schedule_used)
from flash_attn_dash.reference import attention_ref
from flash_attn_dash.schedule.tiles import canonical_window
from flash_attn_dash.varlen_layout import PackedSequence

F64 = torch.float64
HEADS, HEADS_K = 4, 2

# Each feature alone and together; "sink" stands for a learnable_sink tensor made by _features.
FEATURES = {
    "window": dict(window_size=(3, 1)),
    "window_left": dict(window_size=(2, -1)),
    "window_right": dict(window_size=(-1, 2)),
    "causal_window": dict(causal=True, window_size=(3, 5)),  # causal sets right = 0
    "softcap": dict(softcap=1.5),
    "sink": dict(sink=True),
    "all": dict(causal=True, window_size=(4, -1), softcap=2.0, sink=True),
}


def _features(name, heads=HEADS, dtype=F64):
    """The keyword arguments of FEATURES[name], with a fresh sink tensor (requires grad) where it asks for one."""
    kwargs = dict(FEATURES[name])
    if kwargs.pop("sink", False):
        gen = torch.Generator().manual_seed(5)
        kwargs["learnable_sink"] = torch.randn(heads, generator=gen, dtype=dtype).requires_grad_()
    return kwargs


def _leaves(kwargs):
    sink = kwargs.get("learnable_sink")
    return [] if sink is None else [sink]


def _dense(b=2, sq=9, sk=12, h=HEADS, hk=HEADS_K, d=8, dtype=F64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, s, heads, d, generator=gen, dtype=dtype).requires_grad_()
                 for s, heads in ((sq, h), (sk, hk), (sk, hk)))


def _grads(out, leaves, seed=1):
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad(out, leaves, dout)


# --- results and gradients against the reference ------------------------------------------------------------------


@pytest.mark.parametrize("name", FEATURES)
def test_flash_attn_func_matches_reference(name):
    q, k, v = _dense()
    kwargs = _features(name)
    leaves = [q, k, v, *_leaves(kwargs)]
    out, lse = flash_attn_func(q, k, v, return_lse=True, **kwargs)
    ref, ref_lse = attention_ref(q, k, v, **kwargs)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, ref_lse.float())
    plain = flash_attn_func(q, k, v, causal=kwargs.get("causal", False))
    assert not torch.allclose(out, plain)  # the feature changed the result
    for got, want in zip(_grads(out, leaves), _grads(ref, leaves)):
        assert got.dtype == want.dtype
        # dsink comes from the op in fp32, as the fake promises
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_causal_sets_the_right_side_to_zero():
    """FlashAttention-3: causal=True with window (left, right > 0) is causal with (left, 0)."""
    q, k, v = _dense()
    got = flash_attn_func(q, k, v, causal=True, window_size=(3, 5))
    assert torch.equal(got, flash_attn_func(q, k, v, causal=True, window_size=(3, 0)))
    assert torch.equal(got, flash_attn_func(q, k, v, window_size=(3, 0)))
    assert not torch.allclose(got, flash_attn_func(q, k, v, window_size=(3, 5)))


def test_rows_without_keys_see_only_the_sink():
    """Window (0, 0) with seqlen_q > seqlen_k: the first rows see no key, so out = 0 and lse = sink (FA4)."""
    q, k, v = _dense(sq=6, sk=3)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=F64, requires_grad=True)
    out, lse = flash_attn_func(q, k, v, window_size=(0, 0), learnable_sink=sink, return_lse=True)
    assert torch.all(out[:, :3] == 0)
    assert torch.equal(lse[:, :, :3], sink.detach().float().view(1, 4, 1).expand(2, 4, 3))
    _, lse = flash_attn_func(q, k, v, window_size=(0, 0), return_lse=True)
    assert torch.all(lse[:, :, :3] == -math.inf)


def test_sink_gradient_has_the_sinks_dtype_and_sums_over_batch():
    q, k, v = _dense(dtype=torch.float32)
    sink = torch.zeros(HEADS, dtype=torch.bfloat16, requires_grad=True)
    out = flash_attn_func(q, k, v, learnable_sink=sink)
    (dsink,) = torch.autograd.grad(out.square().sum(), (sink,))
    assert dsink.dtype == torch.bfloat16 and dsink.shape == (HEADS,)
    halves = [flash_attn_func(q[i:i + 1], k[i:i + 1], v[i:i + 1], learnable_sink=sink) for i in range(2)]
    per_batch = [torch.autograd.grad(h.square().sum(), (sink,))[0] for h in halves]
    torch.testing.assert_close(dsink, per_batch[0] + per_batch[1])


LENS_Q = [5, 0, 4, 3, 6]
LENS_K = [7, 3, 0, 3, 4]  # an empty sequence, and one whose 4 queries have no key


def _pack(dtype=F64, **kwargs):
    return make_pack(LENS_Q, LENS_K, heads=HEADS, heads_k=HEADS_K, head_dim=8, dtype=dtype, **kwargs)


@pytest.mark.parametrize("name", FEATURES)
def test_flash_attn_varlen_func_matches_per_sequence_reference(name):
    """The window is aligned bottom-right per sequence; the sink's gradient sums every sequence's rows."""
    pack = _pack()
    kwargs = _features(name)
    leaves = [pack.q, pack.k, pack.v, *_leaves(kwargs)]
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), return_lse=True, **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    got = torch.autograd.grad(out, leaves, dout)
    features_only = {key: value for key, value in kwargs.items() if key != "causal"}
    ref_out, ref_lse, *ref_grads = per_sequence_reference(pack, dout, kwargs.get("causal", False), **features_only)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-6, rtol=1e-6)
    if "learnable_sink" in kwargs:  # the 4 queries without keys have lse = sink
        rows = slice(sum(LENS_Q[:2]), sum(LENS_Q[:3]))
        assert torch.equal(lse[:, rows], kwargs["learnable_sink"].detach().float().unsqueeze(1).expand(-1, 4))
    for g, w in zip(got, ref_grads):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def test_varlen_with_seqused_aligns_the_window_on_used_lengths():
    pack = _pack(used_q=[4, 0, 2, 3, 5], used_k=[6, 1, 0, 2, 4])
    kwargs = _features("all")
    out = flash_attn_varlen_func(pack.q, pack.k, pack.v, **pack.args(), **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=out.dtype)
    got = torch.autograd.grad(out, [pack.q, pack.k, pack.v, kwargs["learnable_sink"]], dout)
    ref_out, _, *ref_grads = per_sequence_reference(pack, dout, True, window_size=(4, -1), softcap=2.0,
                                                    learnable_sink=kwargs["learnable_sink"])
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    for g, w in zip(got, ref_grads):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)


def _packed_pairs(kwargs):
    """Each packed entry point with ``kwargs`` and the unpacked call on copies of its views: (packed out, unpacked
    out, packed leaves, unpacked leaves, how the unpacked gradients lay out as the packed ones)."""
    gen = torch.Generator().manual_seed(2)

    def leaf(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64).requires_grad_()

    def copies(*views):
        return [t.detach().clone().requires_grad_() for t in views]

    cu_q, cu_k = cu_seqlens(LENS_Q), cu_seqlens(LENS_K)
    max_q, max_k = max(LENS_Q), max(LENS_K)
    pairs = {}
    qkv = leaf(2, 9, 3, HEADS, 8)
    u = copies(*qkv.unbind(2))
    pairs["qkvpacked"] = (flash_attn_qkvpacked_func(qkv, **kwargs), flash_attn_func(*u, **kwargs), [qkv], u,
                          lambda g: [torch.stack(g, 2)])
    gqa = leaf(2, 9, HEADS + 2 * HEADS_K, 8)
    u = copies(*gqa.split([HEADS, HEADS_K, HEADS_K], 2))
    pairs["qkvpacked_gqa"] = (flash_attn_qkvpacked_func(gqa, num_heads_q=HEADS, **kwargs),
                              flash_attn_func(*u, **kwargs), [gqa], u, lambda g: [torch.cat(g, 2)])
    q, kv = leaf(2, 9, HEADS, 8), leaf(2, 12, 2, HEADS_K, 8)
    u = copies(q, *kv.unbind(2))
    pairs["kvpacked"] = (flash_attn_kvpacked_func(q, kv, **kwargs), flash_attn_func(*u, **kwargs), [q, kv], u,
                         lambda g: [g[0], torch.stack(g[1:], 2)])
    vqkv = leaf(sum(LENS_Q), 3, HEADS, 8)
    u = copies(*vqkv.unbind(1))
    pairs["varlen_qkvpacked"] = (flash_attn_varlen_qkvpacked_func(vqkv, cu_q, max_q, **kwargs),
                                 flash_attn_varlen_func(*u, cu_q, cu_q, max_q, max_q, **kwargs), [vqkv], u,
                                 lambda g: [torch.stack(g, 1)])
    vq, vkv = leaf(sum(LENS_Q), HEADS, 8), leaf(sum(LENS_K), 2, HEADS_K, 8)
    u = copies(vq, *vkv.unbind(1))
    pairs["varlen_kvpacked"] = (flash_attn_varlen_kvpacked_func(vq, vkv, cu_q, cu_k, max_q, max_k, **kwargs),
                                flash_attn_varlen_func(*u, cu_q, cu_k, max_q, max_k, **kwargs), [vq, vkv], u,
                                lambda g: [g[0], torch.stack(g[1:], 1)])
    return pairs


@pytest.mark.parametrize("name", ["window", "causal_window", "softcap", "sink", "all"])
def test_packed_entry_points_match_the_unpacked_ones(name):
    kwargs = _features(name)
    sink = _leaves(kwargs)
    for entry, (packed, unpacked, packed_leaves, unpacked_leaves, layout) in _packed_pairs(kwargs).items():
        torch.testing.assert_close(packed, unpacked, atol=1e-12, rtol=1e-12, msg=entry)
        got = _grads(packed, packed_leaves + sink)
        want = _grads(unpacked, unpacked_leaves + sink)
        want = layout(list(want[:len(unpacked_leaves)])) + list(want[len(unpacked_leaves):])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6, msg=entry)


def test_gradcheck_every_feature_dense_and_varlen():
    q, k, v = _dense(b=1, sq=5, sk=6, h=2, hk=1, d=4)
    sink = torch.tensor([0.3, -0.7], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: flash_attn_func(q, k, v, window_size=(2, 1), softcap=1.5, learnable_sink=s),
        (q, k, v, sink))
    pack = make_pack([3, 0, 4], [2, 2, 5], heads=2, heads_k=1, head_dim=4, dtype=F64)
    args = pack.args()
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: flash_attn_varlen_func(q, k, v, **args, causal=True, window_size=(1, -1), softcap=1.5,
                                                  learnable_sink=s),
        (pack.q, pack.k, pack.v, sink))


# --- the custom ops: fakes, opcheck, torch.compile -----------------------------------------------------------------


def test_fakes_return_dsink_of_the_sinks_heads():
    with FakeTensorMode():
        q, k, sink = torch.empty(2, 9, 4, 16), torch.empty(2, 5, 2, 16), torch.empty(4)
        out, lse = torch.ops.flash_attn_dash.fwd(q, k, k, 0.25, False, 0, 3, 0, 1.5, sink)
        assert out.shape == q.shape and lse.shape == (2, 4, 9)
        *grads, dsink = torch.ops.flash_attn_dash.bwd(out, q, k, k, out, lse, 0.25, False, True, "auto", 0, 3, 0, 1.5,
                                                      sink)
        assert [g.shape for g in grads] == [q.shape, k.shape, k.shape]
        assert dsink.shape == (4,) and dsink.dtype == torch.float32
        vq, vk, cu = torch.empty(9, 4, 16), torch.empty(5, 2, 16), torch.empty(3, dtype=torch.int32)
        out, lse = torch.ops.flash_attn_dash.varlen_fwd(vq, vk, vk, cu, cu, 5, 5, None, None, 0.25, True, 0, 2, -1,
                                                        0.0, sink)
        assert lse.shape == (4, 9)
        dsink = torch.ops.flash_attn_dash.varlen_bwd(out, vq, vk, vk, out, lse, cu, cu, 5, 5, None, None, 0.25, True,
                                                     True, "auto", 0, 2, -1, 0.0, sink)[3]
        assert dsink.shape == (4,) and dsink.dtype == torch.float32


def test_opcheck_dense_and_varlen_ops_with_features():
    q, k, v = (t.detach() for t in _dense(b=1, sq=7, sk=5, h=2, hk=1, d=16, dtype=torch.float32))
    sink = torch.tensor([0.2, -0.4])
    feats = (2, 1, 1.5, sink)
    torch.library.opcheck(torch.ops.flash_attn_dash.fwd.default, (q, k, v, 0.25, False, 0, *feats))
    out, lse = torch.ops.flash_attn_dash.fwd(q, k, v, 0.25, False, 0, *feats)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd.default,
                          (dout, q, k, v, out, lse, 0.25, False, True, "descending", 0, *feats))
    pack = make_pack([3, 0, 4], [2, 3, 4], heads=2, heads_k=1)
    a = pack.args()
    vq, vk, vv = (t.detach() for t in (pack.q, pack.k, pack.v))
    index = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"], None, None)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_fwd.default, (vq, vk, vv, *index, 0.25, True, 0, *feats))
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(vq, vk, vv, *index, 0.25, True, 0, *feats)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd.default,
                          (torch.randn_like(out), vq, vk, vv, out, lse, *index, 0.25, True, True, "auto", 0, *feats))


def test_opcheck_packed_backward_ops_with_features():
    sink, feats = torch.tensor([0.2, -0.4]), (2, 1, 1.5)
    qkv = torch.randn(1, 6, 3, 2, 16)
    out, lse = torch.ops.flash_attn_dash.fwd(*qkv.unbind(2), 0.25, True, 0, *feats, sink)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd_qkvpacked.default,
                          (torch.randn_like(out), qkv, out, lse, None, 0.25, True, True, "auto", 0, *feats, sink))
    q, kv = torch.randn(1, 6, 2, 16), torch.randn(1, 5, 2, 1, 16)
    out, lse = torch.ops.flash_attn_dash.fwd(q, *kv.unbind(2), 0.25, False, 0, *feats, sink)
    torch.library.opcheck(torch.ops.flash_attn_dash.bwd_kvpacked.default,
                          (torch.randn_like(out), q, kv, out, lse, 0.25, False, False, "auto", 0, *feats, sink))
    cu = cu_seqlens([2, 4])
    vqkv = torch.randn(6, 3, 2, 16)
    out, lse = torch.ops.flash_attn_dash.varlen_fwd(*vqkv.unbind(1), cu, cu, 4, 4, None, None, 0.25, True, 0, *feats,
                                                    sink)
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd_qkvpacked.default,
                          (out, vqkv, out, lse, cu, 4, None, 0.25, True, True, "auto", 0, *feats, sink))
    torch.library.opcheck(torch.ops.flash_attn_dash.varlen_bwd_kvpacked.default,
                          (out, vqkv[:, 0].contiguous(), vqkv[:, 1:].contiguous(), out, lse, cu, cu, 4, 4, 0.25, True,
                           False, "auto", 0, *feats, sink))


def _compiled_equals_eager(step, leaves):
    torch._dynamo.reset()
    loss = torch.compile(step, fullgraph=True, backend="aot_eager")(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    want = step(*leaves)
    assert loss.item() > 0
    torch.testing.assert_close(loss, want, atol=0, rtol=0)
    for g, w in zip(grads, torch.autograd.grad(want, leaves)):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_torch_compile_fullgraph_with_features():
    q, k, v = _dense(dtype=torch.float32)
    sink = torch.randn(HEADS, requires_grad=True)

    def dense(q, k, v, sink):
        return flash_attn_func(q, k, v, causal=True, window_size=(3, 5), softcap=2.0, learnable_sink=sink,
                               deterministic=True).square().sum()

    _compiled_equals_eager(dense, (q, k, v, sink))
    pack = _pack(dtype=torch.float32)
    args = pack.args()

    def packed(q, k, v, sink):
        return flash_attn_varlen_func(q, k, v, **args, window_size=(2, 1), softcap=1.5, learnable_sink=sink,
                                      deterministic=True).square().sum()

    _compiled_equals_eager(packed, (pack.q, pack.k, pack.v, sink))
    qkv = torch.randn(2, 9, 3, HEADS, 8, requires_grad=True)
    _compiled_equals_eager(lambda qkv, sink: flash_attn_qkvpacked_func(qkv, window_size=(1, 1), learnable_sink=sink)
                           .square().sum(), (qkv, sink))


# --- validation ---------------------------------------------------------------------------------------------------


def _entry_points():
    """Each public entry point as ``call(**features)`` on small fp32 CPU inputs (4 query heads)."""
    q, k, v = (t.detach() for t in _dense(dtype=torch.float32))
    pack = _pack(dtype=torch.float32)
    vq, vk, vv = (t.detach() for t in (pack.q, pack.k, pack.v))
    a = pack.args()
    cu_q, cu_k, max_q, max_k = a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"]
    return {
        "flash_attn_func": lambda **kw: flash_attn_func(q, k, v, **kw),
        "flash_attn_varlen_func": lambda **kw: flash_attn_varlen_func(vq, vk, vv, **a, **kw),
        "qkvpacked": lambda **kw: flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kw),
        "kvpacked": lambda **kw: flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw),
        "varlen_qkvpacked": lambda **kw: flash_attn_varlen_qkvpacked_func(torch.stack([vq, vq, vq], 1), cu_q, max_q,
                                                                          **kw),
        "varlen_kvpacked": lambda **kw: flash_attn_varlen_kvpacked_func(vq, torch.stack([vk, vv], 1), cu_q, cu_k,
                                                                        max_q, max_k, **kw),
    }


WINDOW_ERROR = r"window_size must be a pair \(left, right\) of ints >= -1 \(-1 = unbounded\)"
BAD_FEATURES = [
    (dict(window_size=(-2, 0)), ValueError, WINDOW_ERROR),
    (dict(window_size=(0, -3)), ValueError, WINDOW_ERROR),
    (dict(window_size=(1,)), ValueError, WINDOW_ERROR),
    (dict(window_size=(1, 2, 3)), ValueError, WINDOW_ERROR),
    (dict(window_size=(1.0, 2)), ValueError, WINDOW_ERROR),
    (dict(window_size=(True, 0)), ValueError, WINDOW_ERROR),
    (dict(window_size=4), ValueError, WINDOW_ERROR),
    (dict(window_size=None), ValueError, WINDOW_ERROR),
    (dict(softcap=-1.0), ValueError, r"softcap must be finite and >= 0 \(0.0 = off\), got -1.0"),
    (dict(softcap=math.inf), ValueError, "softcap must be finite and >= 0"),
    (dict(softcap=math.nan), ValueError, "softcap must be finite and >= 0"),
    (dict(softcap="1"), TypeError, r"softcap must be a float >= 0 \(0.0 = off\), got str"),
    (dict(softcap=True), TypeError, "softcap must be a float"),
    (dict(softcap=None), TypeError, "softcap must be a float"),
    (dict(learnable_sink=torch.zeros(3)), ValueError, r"learnable_sink must have shape \(heads,\) = \(4,\)"),
    (dict(learnable_sink=torch.zeros(4, 1)), ValueError, r"learnable_sink must have shape \(heads,\) = \(4,\)"),
    (dict(learnable_sink=torch.zeros(4, dtype=torch.int64)), TypeError,
     r"learnable_sink.dtype must be one of torch.float16, torch.bfloat16, torch.float32, torch.float64 on cpu"),
    (dict(learnable_sink=[0.0] * 4), TypeError, "learnable_sink must be None or a torch.Tensor"),
    (dict(learnable_sink=torch.zeros(4, device="meta")), ValueError, "learnable_sink must be on q's device"),
    # the mask a window describes decides the schedules: (-1, 0) is the causal mask
    (dict(window_size=(-1, 0), schedule="shift"), ValueError, "full masks only"),
    (dict(window_size=(-1, 0), schedule="shift", deterministic=False), ValueError, "full masks only"),
    (dict(window_size=(-1, 0), schedule="fastest"), ValueError, "schedule must be one of"),
    (dict(window_size=(3, 0), schedule="fastest"), ValueError, "schedule must be one of"),
]


@pytest.fixture
def no_compute(monkeypatch):
    """Any compute (the dense or varlen reference path) fails: an error raised under it came from validation."""
    def boom(*args, **kwargs):
        raise AssertionError("compute ran before validation")

    monkeypatch.setattr(ops, "forward_into", boom)
    monkeypatch.setattr(per_sequence, "forward", boom)


@pytest.mark.parametrize("kwargs,error,match", BAD_FEATURES)
def test_every_entry_point_names_the_bad_feature_before_compute(no_compute, kwargs, error, match):
    for name, call in _entry_points().items():
        with pytest.raises(error, match=match):
            call(**kwargs)


def test_windows_that_are_a_mask_take_that_masks_schedules():
    """(-1, 0) is causal with or without causal=True, so symmetric_shift is valid; a band accepts every order."""
    for call in _entry_points().values():
        causal = call(causal=True)
        assert torch.equal(call(window_size=(-1, 0), schedule="symmetric_shift"), causal)
        assert torch.equal(call(window_size=(100, -1), causal=True, schedule="symmetric_shift"), causal)
        call(window_size=(3, 0), schedule="shift")
        call(window_size=(3, 2), schedule="symmetric_shift")


def test_schedule_used_answers_for_the_mask_a_window_is():
    q, k = torch.empty(1, 512, 2, 64), torch.empty(1, 512, 2, 64)
    for deterministic in (True, False):
        causal = backward_schedule_used(q, k, True, deterministic)
        assert backward_schedule_used(q, k, False, deterministic, window_size=(-1, 0)) == causal
        assert backward_schedule_used(q, k, True, deterministic, window_size=(511, 3)) == causal
        assert backward_schedule_used(q, k, False, deterministic, window_size=(600, 600)) == \
            backward_schedule_used(q, k, False, deterministic)
        # A band runs its own orders: auto and the non-deterministic walk descend, symmetric_shift falls back.
        assert backward_schedule_used(q, k, False, deterministic, window_size=(128, 0)) == "descending"
        assert backward_schedule_used(q, k, False, deterministic, window_size=(64, 64)) == "descending"
    assert backward_schedule_used(q, k, window_size=(128, 0), schedule="ascending") == "ascending"
    assert backward_schedule_used(q, k, window_size=(128, 0), schedule="symmetric_shift") == "descending"
    with pytest.raises(NotImplementedError, match=r"schedule='shift' does not run on sliding windows"):
        backward_schedule_used(q, k, window_size=(128, 0), schedule="shift")
    with pytest.raises(ValueError, match=WINDOW_ERROR):
        backward_schedule_used(q, k, window_size=(-5, 0))
    with pytest.raises(ValueError, match="full masks only"):
        backward_schedule_used(q, k, schedule="shift", window_size=(-1, 0))
    pack = make_pack([300, 0, 200], [300, 5, 250], head_dim=64)
    args = pack.args()
    assert varlen_schedule_used(pack.q, pack.k, **args, window_size=(-1, 0)) == \
        varlen_schedule_used(pack.q, pack.k, **args, causal=True)
    assert varlen_schedule_used(pack.q, pack.k, **args, window_size=(8, 8)) == ["descending", None, "descending"]


# --- the CUDA decision --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,window,seqlen_q,seqlen_k,expected", [
    (False, (-1, -1), 8, 8, False),
    (True, (-1, -1), 8, 8, True),
    (False, (-1, 0), 8, 8, True),  # the causal mask, spelt as a window
    (True, (-1, 5), 8, 8, True),  # causal sets right = 0
    (False, (7, -1), 8, 8, False),  # left >= seqlen_k - 1 clips nothing
    (False, (6, -1), 8, 8, None),
    (False, (-1, 7), 8, 8, False),  # right >= seqlen_q - 1 clips nothing
    (False, (-1, 6), 8, 8, None),
    (False, (-1, 3), 4, 16, False),
    (True, (15, 9), 4, 16, True),
    (True, (3, 0), 8, 8, None),
    (False, (0, 0), 8, 8, None),
    (False, (-1, 0), 1, 8, False),  # one query row: (-1, 0) clips nothing
])
def test_kernel_causal_is_the_mask_a_window_is(causal, window, seqlen_q, seqlen_k, expected):
    """kernel_causal names the mask a window is (None: a band); the kernels run the full mask on the full-mask
    kernels and everything else on the causal ones, given the canonical window."""
    assert features.kernel_causal(causal, window, seqlen_q, seqlen_k) is expected
    canon = canonical_window(causal, window, seqlen_q, seqlen_k)
    kernels = {False: (False, (-1, -1)), True: (True, (-1, 0)), None: (True, canon)}[expected]
    assert features.kernel_window(causal, window, seqlen_q, seqlen_k) == kernels
    assert features.kernel_mask(causal, window, 0.0, seqlen_q, seqlen_k) == kernels


def test_kernel_refusal_names_every_unsupported_argument(monkeypatch):
    """A softcap combination the variant table does not build is refused, naming it; one it builds runs."""
    assert variants.SOFTCAP_WITH == ("window",)
    assert features.kernel_refusal(30.0, (128, 0)) is None
    monkeypatch.setattr(variants, "SOFTCAP_WITH", ())
    assert features.kernel_refusal(30.0, (128, 0)) == (
        "the sm90 kernels do not support softcap=30.0 with a sliding window (no softcap kernel is built for it) yet. "
        "CPU tensors run the PyTorch reference with every feature.")
    assert features.kernel_refusal(0.0) is None
    assert features.kernel_refusal(0.0, has_sink=True) is None
    assert features.kernel_refusal(0.5) is None
    assert "softcap=0.5 with a learnable_sink" in features.kernel_refusal(0.5, has_sink=True)


def test_softcap_kernels_run_the_full_and_causal_masks_alone():
    """A softcap runs on the full and causal kernels (also where a window is one of those masks on the call's shape)
    and on sliding windows (the window's own kernels); with a sink (not built) it is refused, naming the
    combination."""
    assert features.kernel_refusal(50.0) is None
    for causal, window, sq, sk, kernels in [(False, (-1, -1), 64, 64, (False, (-1, -1))),
                                            (True, (-1, -1), 64, 64, (True, (-1, 0))),
                                            (False, (-1, 0), 64, 80, (True, (-1, 0))),
                                            (True, (5000, 3), 64, 64, (True, (-1, 0))),
                                            (False, (100, 100), 64, 64, (False, (-1, -1)))]:
        assert features.kernel_mask(causal, window, 50.0, sq, sk) == kernels
    for window in ((3, 0), (8, 8), (-1, 4)):
        assert features.kernel_mask(False, window, 50.0, 64, 64) == features.kernel_mask(False, window, 0.0, 64, 64)
    with pytest.raises(NotImplementedError, match=r"softcap=50.0 with a learnable_sink \(no softcap kernel"):
        features.kernel_mask(True, (-1, -1), 50.0, 64, 64, has_sink=True)
    with pytest.raises(NotImplementedError, match=r"softcap=50.0 with a learnable_sink \(no softcap kernel"):
        features.kernel_mask(False, (3, 0), 50.0, 64, 64, has_sink=True)
    assert features.kernel_mask(True, (-1, -1), 0.0, 64, 64, has_sink=True) == (True, (-1, 0))


SOFTCAP_SINK_UNBUILT = r"softcap=50.0 with a learnable_sink \(no softcap kernel is built for it\)"
REFUSED = [
    (dict(softcap=50.0), SOFTCAP_SINK_UNBUILT),
    (dict(softcap=50.0, causal=True, window_size=(8, 8)), SOFTCAP_SINK_UNBUILT),
]


def _cuda_entry_points():
    """Each entry point as ``call(**features)`` on fake fp16 CUDA tensors (no GPU needed: fake tensors carry only
    metadata, and the ops run their fake kernels)."""
    q, k = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda"), torch.empty(2, 64, 2, 64,
                                                                                     dtype=torch.float16,
                                                                                     device="cuda")
    vq, vk = q.view(128, 4, 64), k.view(128, 2, 64)
    cu = torch.empty(3, dtype=torch.int32, device="cuda")
    return {
        "flash_attn_func": lambda **kw: flash_attn_func(q, k, k.clone(), **kw),
        "flash_attn_varlen_func": lambda **kw: flash_attn_varlen_func(vq, vk, vk.clone(), cu, cu.clone(), 64, 64,
                                                                      **kw),
        "qkvpacked": lambda **kw: flash_attn_qkvpacked_func(torch.stack([q, q, q], 2), **kw),
        "kvpacked": lambda **kw: flash_attn_kvpacked_func(q, torch.stack([q, q], 2), **kw),
        "varlen_qkvpacked": lambda **kw: flash_attn_varlen_qkvpacked_func(torch.stack([vq, vq, vq], 1), cu, 64, **kw),
        "varlen_kvpacked": lambda **kw: flash_attn_varlen_kvpacked_func(vq, torch.stack([vq, vq], 1), cu, cu.clone(),
                                                                        64, 64, **kw),
    }


@pytest.mark.parametrize("kwargs,match", REFUSED)
def test_cuda_tensors_refuse_what_the_kernels_lack_at_the_call(kwargs, match):
    with FakeTensorMode():
        for call in _cuda_entry_points().values():
            with pytest.raises(NotImplementedError, match=match):
                call(**{**kwargs, "learnable_sink": torch.zeros(4, device="cuda")})


def test_cuda_tensors_run_windows_and_masks():
    """Every entry point runs sliding windows (also with a softcap) and the windows that are a mask on (fake) CUDA
    tensors (the window kernels passed tests/test_window_gpu.py and tests/test_softcap_gpu.py on the H200); a sink in a dtype the kernels lack is refused."""
    with FakeTensorMode():
        for name, call in _cuda_entry_points().items():
            for kwargs in (dict(window_size=(-1, 0)), dict(causal=True, window_size=(63, 9)),
                           dict(window_size=(-1, 63)), dict(window_size=(100, 100)), dict(window_size=(3, 0)),
                           dict(causal=True, window_size=(2, 7)), dict(window_size=(8, 8)),
                           dict(softcap=50.0, window_size=(3, 0)), dict(softcap=50.0, causal=True, window_size=(8, 8))):
                out = call(**kwargs)
                assert out.is_cuda and out.shape[-2:] == (4, 64), name
        with pytest.raises(TypeError, match="learnable_sink.dtype must be one of torch.float16, torch.bfloat16, "
                                            "torch.float32 on cuda"):
            _cuda_entry_points()["flash_attn_func"](learnable_sink=torch.zeros(4, dtype=torch.float64,
                                                                                  device="cuda"))


def test_cuda_tensors_run_learnable_sinks():
    """Sinks passed their GPU tests (tests/test_sink_gpu.py): every entry point runs one on (fake) CUDA tensors, in
    each dtype the kernels take, alone and with the causal mask."""
    with FakeTensorMode():
        for name, call in _cuda_entry_points().items():
            for dtype in (torch.float16, torch.bfloat16, torch.float32):
                for kwargs in (dict(), dict(causal=True)):
                    out = call(learnable_sink=torch.zeros(4, dtype=dtype, device="cuda"), **kwargs)
                    assert out.is_cuda and out.shape[-2:] == (4, 64), name


@pytest.fixture(params=["varlen_kernels", "per_sequence"])
def cuda_spies(monkeypatch, request):
    """The CUDA paths of the ops down to their launches, with the launches recorded instead of run (fake CUDA tensors
    have no memory): the forward's ``fwd_out`` and the backward's ``bwd_into`` arguments, and the varlen path's
    kernel launches (``varlen_fwd_out``/``varlen_bwd_out``, from the scale on) or, with the varlen kernels switched
    off (the param), its per-sequence dense calls."""
    calls = []
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", request.param == "varlen_kernels")
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", request.param == "varlen_kernels")
    monkeypatch.setattr(ops, "check_cuda_inputs", lambda *args: calls.append("checked"))
    monkeypatch.setattr(ops._ext, "require_kernels", lambda: None)
    monkeypatch.setattr(torch.ops.flash_attn_dash, "fwd_out", lambda *args: calls.append(("fwd_out", args[5:])))
    monkeypatch.setattr(ops, "bwd_into", lambda *args, **kwargs: calls.append(("bwd_into", args[9:], kwargs)))
    monkeypatch.setattr(varlen_cuda.checks, "check_sm_margin", lambda sm_margin, device: 132 - sm_margin)
    monkeypatch.setattr(varlen_cuda, "status_word", lambda device: "status word")
    monkeypatch.setattr(varlen_cuda, "raise_pending_error", lambda device: None)
    monkeypatch.setattr(torch.ops.flash_attn_dash, "varlen_fwd_out",
                        lambda *args: calls.append(("varlen_fwd_out", args[12:])))
    monkeypatch.setattr(torch.ops.flash_attn_dash, "varlen_bwd_out",
                        lambda *args: calls.append(("varlen_bwd_out", args[16:])))
    seqs = [PackedSequence(0, 64, 0, 64), PackedSequence(64, 64, 64, 64)]
    monkeypatch.setattr(varlen_cuda, "read_layout", lambda *args: seqs)
    monkeypatch.setattr(varlen_cuda.varlen_per_sequence, "forward",
                        lambda *args, **kwargs: calls.append(("varlen_forward", args[4:], kwargs)))
    monkeypatch.setattr(varlen_cuda.varlen_per_sequence, "backward_into",
                        lambda *args, **kwargs: calls.append(("varlen_backward", args[10:], kwargs)))
    return calls


def _cuda_op_paths(causal, window, sink=None):
    """What the CUDA branches of the dense and varlen ops pass to their launches for these arguments."""
    q = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda")
    lse = torch.empty(2, 4, 64, device="cuda")
    ops.forward_into(q, q, q, q, lse, 0.125, causal, 0, window_size=window, learnable_sink=sink)
    ops.backward_into(q, q, q, q, q, lse, q, q, q, 0.125, causal, True, "auto", 0, window_size=window,
                      learnable_sink=sink)
    vq, cu = q.view(128, 4, 64), torch.empty(3, dtype=torch.int32, device="cuda")
    varlen_cuda.forward(vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, causal, 0, window, 0.0, sink)
    varlen_cuda.backward_into(vq, vq, vq, vq, vq, lse, vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, causal, True,
                              "auto", 0, window, 0.0, sink)


@pytest.mark.parametrize("causal,window,plain_causal", [
    (False, (-1, 0), True), (True, (-1, 7), True), (True, (63, -1), True), (False, (63, 63), False),
    (False, (-1, -1), False),
])
def test_windows_that_are_a_mask_launch_exactly_the_plain_call(cuda_spies, causal, window, plain_causal):
    with FakeTensorMode():
        _cuda_op_paths(plain_causal, (-1, -1))
        plain = list(cuda_spies)
        cuda_spies.clear()
        _cuda_op_paths(causal, window)
    dense = [c for c in cuda_spies if c == "checked" or c[0] in ("fwd_out", "bwd_into")]
    assert dense == [c for c in plain if c == "checked" or c[0] in ("fwd_out", "bwd_into")]
    kernel_window = (-1, 0) if plain_causal else (-1, -1)
    assert [c for c in plain if c != "checked"][:2] == [
        ("fwd_out", (0.125, plain_causal, 0, *kernel_window, None, 0.0)),
        ("bwd_into", (0.125, plain_causal, True, "auto", 0),
         {"window": kernel_window, "softcap": 0.0, "learnable_sink": None, "dsink": None}),
    ]
    varlen = [c for c in cuda_spies if c != "checked" and c[0].startswith("varlen")]
    if varlen_cuda.FWD_KERNEL_VALIDATED:
        # The varlen kernels take the mask at the maximum lengths: on these 64-token packs the plain call's.
        plain_varlen = [c for c in plain if c != "checked" and c[0].startswith("varlen")]
        assert varlen == plain_varlen
        assert [c[0] for c in varlen] == ["varlen_fwd_out", "varlen_bwd_out"]
        assert varlen[0][1] == (0.125, plain_causal, 0, *kernel_window, None, 0.0)
    else:
        # Each sequence's dense call gets the call's own (causal, window_size), as flash_attn_func would get them for
        # that sequence alone; on these 64-token sequences they pick the plain call's kernels.
        assert [(c[1][1], c[2]["window_size"]) for c in varlen] == [(causal, window)] * 2
        assert all(features.kernel_window(causal, window, 64, 64) == (plain_causal, kernel_window) for _ in varlen)


def test_cuda_op_paths_refuse_before_any_check_or_launch(cuda_spies):
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda")
        lse = torch.empty(2, 4, 64, device="cuda")
        sink = torch.zeros(4, device="cuda")
        refused = r"the sm90 kernels do not support softcap=3.0 with a learnable_sink \(no softcap kernel"
        with pytest.raises(NotImplementedError, match=refused):
            ops.forward_into(q, q, q, q, lse, 0.125, False, 0, window_size=(3, 0), softcap=3.0, learnable_sink=sink)
        with pytest.raises(NotImplementedError, match=refused):
            ops.backward_into(q, q, q, q, q, lse, q, q, q, 0.125, False, True, "auto", 0, window_size=(3, 0),
                              softcap=3.0, learnable_sink=sink, dsink=torch.zeros(4, device="cuda"))
        vq, cu = q.view(128, 4, 64), torch.empty(3, dtype=torch.int32, device="cuda")
        with pytest.raises(NotImplementedError, match="softcap=3.0 with a learnable_sink"):
            varlen_cuda.forward(vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, False, 0, (3, 0), 3.0, sink)
    assert cuda_spies == []


def test_cuda_tensors_run_softcaps():
    """Every entry point runs a softcap on (fake) CUDA tensors, with the full and causal masks;
    with a sink it is refused at the call, naming both."""
    with FakeTensorMode():
        for name, call in _cuda_entry_points().items():
            for kwargs in (dict(softcap=50.0), dict(softcap=5.0, causal=True), dict(softcap=30.0, window_size=(-1, 0))):
                out = call(**kwargs)
                assert out.is_cuda and out.shape[-2:] == (4, 64), name
            with pytest.raises(NotImplementedError, match=r"softcap=30.0 with a learnable_sink"):
                call(softcap=30.0, learnable_sink=torch.zeros(4, device="cuda"))


@pytest.mark.parametrize("causal,window,kernel_causal,kernel_window", [
    (False, (-1, -1), False, (-1, -1)), (True, (-1, -1), True, (-1, 0)), (False, (-1, 0), True, (-1, 0)),
    (True, (500, -1), True, (-1, 0)), (False, (16, 0), True, (16, 0)),
])
def test_softcap_reaches_the_kernel_launches(cuda_spies, causal, window, kernel_causal, kernel_window):
    """The CUDA paths hand the softcap to the forward's fwd_out and the backward's bwd_into (the C++ launchers pick
    the softcap kernels from it) with the mask kernel_mask names, and the varlen path to its kernels (or to each
    sequence's dense call)."""
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda")
        lse = torch.empty(2, 4, 64, device="cuda")
        ops.forward_into(q, q, q, q, lse, 0.125, causal, 0, window_size=window, softcap=30.0)
        ops.backward_into(q, q, q, q, q, lse, q, q, q, 0.125, causal, False, "auto", 0, window_size=window,
                          softcap=30.0)
        vq, cu = q.view(128, 4, 64), torch.empty(3, dtype=torch.int32, device="cuda")
        varlen_cuda.forward(vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, causal, 0, window, 30.0, None)
        varlen_cuda.backward_into(vq, vq, vq, vq, vq, lse, vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, causal,
                                  True, "auto", 0, window, 30.0, None)
    launches = [c for c in cuda_spies if c != "checked"]
    assert launches[:2] == [
        ("fwd_out", (0.125, kernel_causal, 0, *kernel_window, None, 30.0)),
        ("bwd_into", (0.125, kernel_causal, False, "auto", 0), {"window": kernel_window, "softcap": 30.0,
                                                               "learnable_sink": None, "dsink": None}),
    ]
    varlen = [c for c in launches if c[0].startswith("varlen")]
    if varlen_cuda.FWD_KERNEL_VALIDATED:
        (fwd, fwd_args), (bwd, bwd_args) = varlen
        assert (fwd, fwd_args) == ("varlen_fwd_out", (0.125, kernel_causal, 0, *kernel_window, None, 30.0))
        # scale, causal, deterministic, schedule id, grid, sm_margin, window, softcap, sink, dsink, GQA fold (3)
        assert bwd == "varlen_bwd_out"
        assert bwd_args[:3] == (0.125, kernel_causal, True) and bwd_args[5:] == (0, *kernel_window, 30.0, None, None,
                                                                                 False, 0, 0)
    else:
        assert [(c[0], c[2]["softcap"], c[2]["window_size"]) for c in varlen] == [
            ("varlen_forward", 30.0, window), ("varlen_backward", 30.0, window)]


def test_cuda_op_paths_refuse_softcap_with_a_sink_before_any_launch(cuda_spies):
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda")
        lse = torch.empty(2, 4, 64, device="cuda")
        sink = torch.zeros(4, device="cuda")
        with pytest.raises(NotImplementedError, match="softcap=3.0 with a learnable_sink"):
            ops.forward_into(q, q, q, q, lse, 0.125, True, 0, softcap=3.0, learnable_sink=sink)
        with pytest.raises(NotImplementedError, match="softcap=3.0 with a learnable_sink"):
            ops.backward_into(q, q, q, q, q, lse, q, q, q, 0.125, True, True, "auto", 0, softcap=3.0,
                              learnable_sink=sink)
        vq, cu = q.view(128, 4, 64), torch.empty(3, dtype=torch.int32, device="cuda")
        with pytest.raises(NotImplementedError, match="softcap=3.0 with a learnable_sink"):
            varlen_cuda.forward(vq, vq, vq, cu, cu, 64, 64, None, None, 0.125, False, 0, (-1, -1), 3.0, sink)
    assert cuda_spies == []


def test_the_sink_gradient_kernel_gets_the_sink_and_its_buffer(cuda_spies):
    """ops.backward_into hands the backward launch the sink and the dsink buffer (the sink's gradient is reduced by
    the kernels, hopper/bwd/sink_grad.hpp), and neither without a sink."""
    with FakeTensorMode():
        q = torch.empty(2, 64, 4, 64, dtype=torch.float16, device="cuda")
        lse = torch.empty(2, 4, 64, device="cuda")
        sink, dsink = torch.empty(4, device="cuda"), torch.zeros(4, device="cuda")
        for given, buffer in ((sink, dsink), (None, torch.zeros(0, device="cuda"))):
            cuda_spies.clear()
            ops.backward_into(q, q, q, q, q, lse, q, q, q, 0.125, True, True, "auto", 0, learnable_sink=given,
                              dsink=buffer)
            (call,) = [c for c in cuda_spies if c != "checked"]
            assert call[2]["learnable_sink"] is given
            assert call[2]["dsink"] is (dsink if given is not None else None)
