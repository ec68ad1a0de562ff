"""flash_attn_dash as torch's flash-attention implementation, on CPU (the ops run the PyTorch reference).

The aten kernels are called directly and, through ``cpu_kernels`` (our implementations registered as the CPU kernels
of the aten ops for one test), through torch's dispatcher and its autograd formulas, as F.scaled_dot_product_attention
and varlen_attn call them on CUDA. Outputs are compared with torch's SDPA math and with flash_attn_func, return values
with torch's own meta kernels (what torch.compile traces with).
"""
from __future__ import annotations

import inspect
import math
import re

import pytest
import torch
import torch.nn.attention as attention
import torch.nn.functional as F
from torch.nn.attention.varlen import AuxRequest, varlen_attn, varlen_attn_out
from varlen_packs import cu_seqlens, make_pack

from flash_attn_dash import checks, flash_attn_func, flash_attn_varlen_func
from flash_attn_dash.integrations import torch_flash as tf

aten = torch.ops.aten


@pytest.fixture
def cpu_kernels():
    handle = tf._register_kernels("CPU")
    yield
    handle.remove()


@pytest.fixture(autouse=True)
def clean_state():
    """Each test starts with torch's kernels, default schedules, torch's determinism switch off, no carveout."""
    schedules = dict(tf._schedules)
    yield
    if attention.current_flash_attention_impl() == tf.IMPL_NAME:
        attention.restore_flash_attention_impl()
    tf._schedules.update(schedules)
    torch.use_deterministic_algorithms(False)
    torch._C._set_sm_carveout_experimental(None)


def sdpa_inputs(b=2, h=4, hk=4, sq=33, sk=33, d=64, dtype=torch.float64, layout="bshd", grad=False, seed=0):
    """SDPA-layout (batch, heads, seqlen, head_dim) tensors; layout "bshd" makes them transposes of (b, s, h, d)
    memory, as a model's projections give them, "bhsd" contiguous in SDPA's own layout."""
    g = torch.Generator().manual_seed(seed)

    def make(heads, s):
        if layout == "bshd":
            t = torch.randn(b, s, heads, d, generator=g, dtype=dtype).transpose(1, 2)
        else:
            t = torch.randn(b, heads, s, d, generator=g, dtype=dtype)
        return t.requires_grad_(grad)

    return make(h, sq), make(hk, sk), make(hk, sk)


def lse_ref(q, k, scale, causal=False):
    """logsumexp of the scaled scores in SDPA layout (top-left causal, as SDPA's math; tests use sq == sk)."""
    group = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), -math.inf)
    return torch.logsumexp(scores, dim=-1)


def assert_like_meta(result, meta):
    """Arity, None positions, ints, and each tensor's shape, dtype and strides as torch's meta kernel returns them."""
    result = result if isinstance(result, tuple) else (result,)
    meta = meta if isinstance(meta, tuple) else (meta,)
    assert len(result) == len(meta)
    for i, (r, m) in enumerate(zip(result, meta)):
        if isinstance(m, torch.Tensor):
            assert isinstance(r, torch.Tensor), i
            assert (r.shape, r.dtype, r.stride()) == (m.shape, m.dtype, m.stride()), i
        else:
            assert r == m, i


def to_meta(*tensors):
    return tuple(t.detach().to("meta") for t in tensors)


# --- schema and signatures ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", sorted(tf._ATEN_IMPLS))
def test_implementation_signatures_follow_the_schema(op):
    """The dispatcher passes keyword-only arguments by name: every name and its kind must be the schema's."""
    schema = getattr(aten, op).default._schema
    params = list(inspect.signature(tf._ATEN_IMPLS[op]).parameters.values())
    assert [p.name for p in params] == [a.name for a in schema.arguments]
    assert [p.kind == p.KEYWORD_ONLY for p in params] == [a.kwarg_only for a in schema.arguments]


def test_every_hook_op_is_implemented():
    assert set(tf._ATEN_IMPLS) == {
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
        "_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace", "_flash_attention_backward"}


# --- SDPA ops ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_sdpa_forward_matches_sdpa_math(layout, causal, hk):
    q, k, v = sdpa_inputs(hk=hk, layout=layout)
    result = tf.scaled_dot_product_flash_attention(q, k, v, is_causal=causal, scale=0.2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(result[0], expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(result[1], lse_ref(q, k, 0.2, causal).float(), atol=1e-5, rtol=1e-6)
    assert_like_meta(result, aten._scaled_dot_product_flash_attention(*to_meta(q, k, v), 0.0, causal, scale=0.2))
    assert result[0].stride() == torch.empty_like(q).stride()  # laid out like query, in both layouts


def test_sdpa_default_scale_is_head_dim_rsqrt():
    q, k, v = sdpa_inputs(d=128)
    out = tf.scaled_dot_product_flash_attention(q, k, v)[0]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_backward_matches_sdpa_math(layout, causal):
    q, k, v = sdpa_inputs(hk=2, layout=layout, grad=True)
    dout = torch.randn(q.shape, dtype=q.dtype)
    out, lse, cq, ck, max_q, max_k, seed, offset, _ = tf.scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    grads = tf.scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cq, ck, max_q, max_k, 0.0, causal,
                                                           seed, offset)
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True),
                                   (q, k, v), dout)
    for g, e, t in zip(grads, expected, (q, k, v)):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)
        assert g.stride() == t.stride()  # laid out like its input
    meta = aten._scaled_dot_product_flash_attention_backward(*to_meta(dout, q, k, v, out, lse), None, None, max_q,
                                                             max_k, 0.0, causal, *to_meta(seed, offset))
    assert_like_meta(grads, meta)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_through_the_dispatcher_and_autograd(cpu_kernels, causal):
    """As F.scaled_dot_product_attention runs it on CUDA: the aten op, then torch's derivative formula calling our
    backward op (with the expanded grad_out of .sum(), which the kernels cannot read in place)."""
    q, k, v = sdpa_inputs(hk=1, sq=48, sk=48, grad=True)
    out = aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal)[0]
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    for g, e in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)


def test_sdpa_layouts_the_kernels_cannot_take_are_copied():
    """A last dim that is not contiguous: inputs are copied for the kernels, and outputs written to scratch, then
    copied into tensors laid out as torch's meta kernels lay them out (like the inputs)."""
    q, k, v = (torch.randn(2, 4, 64, 33, dtype=torch.float64).transpose(2, 3).requires_grad_() for _ in range(3))
    dout = torch.randn(2, 4, 64, 33, dtype=torch.float64).transpose(2, 3)
    out, lse, cq, ck, mq, mk, seed, offset, _ = tf.scaled_dot_product_flash_attention(q, k, v, 0.0, True)
    grads = tf.scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, True, seed,
                                                           offset)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    assert out.stride() == q.stride()
    for g, e, t in zip(grads, torch.autograd.grad(ref, (q, k, v), dout), (q, k, v)):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=1e-10)
        assert g.stride() == t.stride()


def test_sdpa_causal_with_unequal_lengths_aligns_bottom_right():
    """As torch's flash kernel (FlashAttention-2) aligns it (SDPA's math backend aligns it top-left)."""
    q, k, v = sdpa_inputs(sq=20, sk=45)
    out, lse = tf.scaled_dot_product_flash_attention(q, k, v, is_causal=True)[:2]
    ref_out, ref_lse = flash_attn_func(*(t.transpose(1, 2) for t in (q, k, v)), causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out.transpose(1, 2), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float())


# --- _flash_attention_* ops --------------------------------------------------------------------------------------


def bshd_inputs(b=2, s_q=40, s_k=56, h=4, hk=2, d=64, dtype=torch.float64, grad=False):
    g = torch.Generator().manual_seed(1)
    return tuple(torch.randn(b, s, heads, d, generator=g, dtype=dtype).requires_grad_(grad)
                 for s, heads in ((s_q, h), (s_k, hk), (s_k, hk)))


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_dense_matches_flash_attn_func(causal):
    q, k, v = bshd_inputs(grad=True)
    dout = torch.randn(q.shape, dtype=q.dtype)
    result = tf.flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, causal, False, scale=0.3)
    ref_out, ref_lse = flash_attn_func(q, k, v, softmax_scale=0.3, causal=causal, return_lse=True)
    torch.testing.assert_close(result[0], ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(result[1], ref_lse.float())
    assert_like_meta(result, aten._flash_attention_forward(*to_meta(q, k, v), None, None, 0, 0, 0.0, causal, False,
                                                           scale=0.3))
    out, lse, rng_state, unused, _ = result
    grads = tf.flash_attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.0, causal, rng_state, unused,
                                        scale=0.3)
    for g, e in zip(grads, torch.autograd.grad(ref_out, (q, k, v), dout)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)
    assert_like_meta(grads, aten._flash_attention_backward(*to_meta(dout, q, k, v, out, lse), None, None, 0, 0, 0.0,
                                                           causal, *to_meta(rng_state, unused), scale=0.3))


def test_flash_attention_placeholders_are_zero():
    """rng_state/unused are read by nothing without dropout; they are defined zeros, not uninitialised memory."""
    _, _, rng_state, unused, debug_mask = tf.flash_attention_forward(*bshd_inputs(), None, None, 0, 0, 0.0, False,
                                                                     False)
    assert rng_state.tolist() == [0, 0] and unused.item() == 0 and debug_mask.numel() == 0


def test_window_minus_one_zero_is_the_causal_mask():
    """varlen_attn(window_size=(-1, 0)) passes is_causal=True with window_size_right=0; the window alone means the
    same mask."""
    q, k, v = bshd_inputs()
    causal = tf.flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, True, False)[0]
    window = tf.flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, False, False, window_size_left=-1,
                                        window_size_right=0)[0]
    full = tf.flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, False, False, window_size_left=-1,
                                      window_size_right=-1)[0]
    torch.testing.assert_close(window, causal, atol=0, rtol=0)
    assert not torch.allclose(full, causal)


@pytest.mark.parametrize("left,right", [(8, 0), (5, 3), (None, 4), (12, None)])
def test_sliding_windows_have_flash_attn_funcs_semantics(left, right):
    """aten's window_size_left/right (None = -1) on CPU tensors: flash_attn_func's window, forward and backward (CUDA
    tensors run the same windows on the kernels: tests/test_window_gpu.py)."""
    q, k, v = bshd_inputs(grad=True)
    window = tuple(-1 if side is None else side for side in (left, right))
    out, lse, rng_state, unused, _ = tf.flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, False, False,
                                                                window_size_left=left, window_size_right=right)
    ref, ref_lse = flash_attn_func(q, k, v, window_size=window, return_lse=True)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    torch.testing.assert_close(lse, ref_lse, atol=0, rtol=0)
    assert not torch.allclose(out, flash_attn_func(q, k, v, causal=right == 0))
    dout = torch.randn(q.shape, dtype=q.dtype)
    grads = tf.flash_attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.0, False, rng_state, unused,
                                        window_size_left=left, window_size_right=right)
    for g, e in zip(grads, torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(g, e, atol=0, rtol=0)


@pytest.mark.parametrize("strided", [False, True])
def test_inplace_forward_writes_out(strided):
    q, k, v = bshd_inputs()
    if strided:  # last dim not contiguous: the kernels cannot write it in place, the result is copied in
        out = torch.empty(q.shape[0], q.shape[1], q.shape[3], q.shape[2], dtype=q.dtype).transpose(2, 3)
    else:
        out = torch.empty_like(q)
    lse = tf.flash_attention_forward_no_dropout_inplace(out, q, k, v, None, None, 0, 0, 0.0, True, False)
    ref_out, ref_lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse.float())
    assert_like_meta(lse, aten._flash_attention_forward_no_dropout_inplace(*to_meta(out, q, k, v), None, None, 0, 0,
                                                                           0.0, True, False))


def test_flash_attention_through_the_dispatcher_and_autograd(cpu_kernels):
    q, k, v = bshd_inputs(grad=True)
    out = aten._flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, True, False)[0]
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ref = flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for g, e in zip(grads, torch.autograd.grad(ref.sum(), (q, k, v))):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("op", ["sdpa-bshd", "sdpa-bhsd", "flash"])
def test_torch_compile_accepts_our_outputs(cpu_kernels, op):
    """Inductor runs the aten ops as fallbacks and asserts their outputs' sizes and strides against torch's meta
    kernels, forward and backward: the layouts we return are the ones a compiled graph expects."""
    if op == "flash":
        q, k, v = bshd_inputs(dtype=torch.float32, grad=True)
        fn = lambda q, k, v: aten._flash_attention_forward(q, k, v, None, None, 0, 0, 0.0, True, False)[0]  # noqa: E731
    else:
        q, k, v = sdpa_inputs(hk=2, dtype=torch.float32, layout=op[5:], grad=True)
        fn = lambda q, k, v: aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[0]  # noqa: E731
    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True)(q, k, v)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    ref = fn(q, k, v)
    torch.testing.assert_close(out, ref)
    for g, e in zip(grads, torch.autograd.grad(ref.square().sum(), (q, k, v))):
        torch.testing.assert_close(g, e)


# --- what we do not implement raises, naming the argument ---------------------------------------------------------


def _fwd(**overrides):
    q, k, v = bshd_inputs()
    args = dict(query=q, key=k, value=v, cum_seq_q=None, cum_seq_k=None, max_q=0, max_k=0, dropout_p=0.0,
                is_causal=False, return_debug_mask=False)
    args.update(overrides)
    positional = [args.pop(n) for n in ("query", "key", "value", "cum_seq_q", "cum_seq_k", "max_q", "max_k",
                                        "dropout_p", "is_causal", "return_debug_mask")]
    return tf.flash_attention_forward(*positional, **args)


@pytest.mark.parametrize("overrides, argument", [
    (dict(dropout_p=0.1), "dropout_p must be 0.0"),
    (dict(return_debug_mask=True), "return_debug_mask must be False"),
    (dict(alibi_slopes=torch.ones(4)), "alibi_slopes must be None"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "block_table must be None"),
    (dict(num_splits=2), "num_splits must be None, 0 or 1"),
    (dict(window_size_left=-2), r"window_size_left must be None, -1 \(unbounded\) or >= 0, got -2"),
    (dict(window_size_right=-5), r"window_size_right must be None, -1 \(unbounded\) or >= 0, got -5"),
    (dict(seqused_k=torch.ones(2, dtype=torch.int32)), "seqused_k must be None"),
    (dict(cum_seq_q=torch.zeros(3, dtype=torch.int32)), "cum_seq_q and cum_seq_k must both be None"),
    (dict(scale=float("inf")), "softmax_scale must be finite"),
])
def test_flash_attention_forward_refuses(overrides, argument):
    with pytest.raises(ValueError, match=f"^aten::_flash_attention_forward on flash_attn_dash: {argument}"):
        _fwd(**overrides)


@pytest.mark.parametrize("head_dim", [32, 80, 320])
def test_head_dims_without_kernels_are_refused_on_every_device(head_dim):
    q, k, v = sdpa_inputs(d=head_dim)
    with pytest.raises(ValueError, match="head_dim must be one of " + re.escape(str(checks.KERNEL_HEAD_DIMS))):
        tf.scaled_dot_product_flash_attention(q, k, v)
    with pytest.raises(ValueError, match="head_dim must be one of " + re.escape(str(checks.KERNEL_HEAD_DIMS))):
        _fwd(**dict(zip(("query", "key", "value"), bshd_inputs(d=head_dim))))


def test_sdpa_forward_refuses():
    q, k, v = sdpa_inputs()
    op = "^aten::_scaled_dot_product_flash_attention on flash_attn_dash: "
    with pytest.raises(ValueError, match=op + "dropout_p must be 0.0"):
        tf.scaled_dot_product_flash_attention(q, k, v, 0.5)
    with pytest.raises(ValueError, match=op + "return_debug_mask must be False"):
        tf.scaled_dot_product_flash_attention(q, k, v, return_debug_mask=True)
    with pytest.raises(ValueError, match=op + "query must be 4-D \\(batch, heads, seqlen, head_dim\\)"):
        tf.scaled_dot_product_flash_attention(q[0], k, v)
    with pytest.raises(ValueError, match=op + "value.shape must equal key.shape"):
        tf.scaled_dot_product_flash_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match="heads \\(4\\) must be a multiple of key/value heads \\(3\\)"):
        tf.scaled_dot_product_flash_attention(q, k[:, :3], v[:, :3])
    with pytest.raises(TypeError, match="key.dtype must equal query.dtype"):
        tf.scaled_dot_product_flash_attention(q, k.float(), v)


def test_backwards_refuse():
    q, k, v = sdpa_inputs()
    out, lse, cq, ck, max_q, max_k, seed, offset, _ = tf.scaled_dot_product_flash_attention(q, k, v)
    dout = torch.ones_like(out)
    sdpa_bwd = "^aten::_scaled_dot_product_flash_attention_backward on flash_attn_dash: "
    with pytest.raises(ValueError, match=sdpa_bwd + "dropout_p must be 0.0"):
        tf.scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cq, ck, max_q, max_k, 0.1, False,
                                                       seed, offset)
    cu = torch.tensor([0, 33, 66], dtype=torch.int32)
    with pytest.raises(ValueError, match=sdpa_bwd + "cum_seq_q and cum_seq_k must be None"):
        tf.scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, cu, cu, max_q, max_k, 0.0, False,
                                                       seed, offset)
    with pytest.raises(ValueError, match=sdpa_bwd + "logsumexp must be float32 of shape \\(2, 4, 33\\)"):
        tf.scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse[:, :, :7], cq, ck, max_q, max_k, 0.0,
                                                       False, seed, offset)
    with pytest.raises(ValueError, match=sdpa_bwd + "grad_out must match query"):
        tf.scaled_dot_product_flash_attention_backward(dout[:1], q, k, v, out, lse, cq, ck, max_q, max_k, 0.0, False,
                                                       seed, offset)
    flash_bwd = "^aten::_flash_attention_backward on flash_attn_dash: "
    q, k, v, out, dout = (t.transpose(1, 2) for t in (q, k, v, out, dout))
    with pytest.raises(ValueError, match=flash_bwd + "dropout_p must be 0.0"):
        tf.flash_attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.1, False, seed, offset)
    with pytest.raises(ValueError, match=flash_bwd + "window_size_left must be None, -1"):
        tf.flash_attention_backward(dout, q, k, v, out, lse, None, None, 0, 0, 0.0, False, seed, offset,
                                    window_size_left=-8)


def test_inplace_forward_refuses_a_mismatched_out():
    q, k, v = bshd_inputs()
    with pytest.raises(ValueError, match="out must match query in shape, dtype and device"):
        tf.flash_attention_forward_no_dropout_inplace(torch.empty_like(q, dtype=torch.float32), q, k, v, None, None,
                                                      0, 0, 0.0, False, False)


def test_refusals_reach_the_caller_through_the_dispatcher(cpu_kernels):
    q, k, v = sdpa_inputs()
    with pytest.raises(ValueError, match="^aten::_scaled_dot_product_flash_attention on flash_attn_dash: dropout_p"):
        aten._scaled_dot_product_flash_attention(q, k, v, 0.25)


# --- determinism, schedules, SM margin ---------------------------------------------------------------------------


@pytest.fixture
def backward_calls(monkeypatch):
    """The (deterministic, schedule, sm_margin) each backward passes to our backward (which still runs)."""
    calls = []
    real = tf.ops.backward_into

    def spy(*args, **features):
        calls.append(args[-3:])
        return real(*args, **features)

    monkeypatch.setattr(tf.ops, "backward_into", spy)
    return calls


def _sdpa_backward(causal):
    q, k, v = sdpa_inputs(sq=20, sk=20)
    out, lse, cq, ck, mq, mk, seed, offset, _ = tf.scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
    tf.scaled_dot_product_flash_attention_backward(torch.ones_like(out), q, k, v, out, lse, cq, ck, mq, mk, 0.0,
                                                   causal, seed, offset)


def test_backward_follows_torchs_determinism_switch(backward_calls):
    _sdpa_backward(False)
    torch.use_deterministic_algorithms(True)
    _sdpa_backward(False)
    assert [c[0] for c in backward_calls] == [False, True]


def test_backward_runs_the_schedule_set_for_its_mask(backward_calls):
    tf.set_schedule("shift", mask="full")
    tf.set_schedule("symmetric_shift", mask="causal")
    _sdpa_backward(False)
    _sdpa_backward(True)
    tf.set_schedule("ascending")
    _sdpa_backward(False)
    _sdpa_backward(True)
    assert [c[1] for c in backward_calls] == ["shift", "symmetric_shift", "ascending", "ascending"]


def test_sm_margin_follows_torchs_carveout(backward_calls):
    _sdpa_backward(True)
    torch._C._set_sm_carveout_experimental(8)
    _sdpa_backward(True)
    assert [c[2] for c in backward_calls] == [0, 8]
    torch._C._set_sm_carveout_experimental(132)  # leaves no SM of the modelled H200
    with pytest.raises(ValueError, match=re.escape("SM carveout (torch._C._set_sm_carveout_experimental) is "
                                                   "flash_attn_dash's sm_margin: it must be in [0, 132)")):
        _sdpa_backward(True)


def test_set_schedule_validates():
    assert tf.get_schedule(False) == tf.get_schedule(True) == "auto"
    with pytest.raises(ValueError, match="schedule must be one of 'auto', 'ascending'"):
        tf.set_schedule("fastest")
    with pytest.raises(ValueError, match="schedule='shift' is defined for full masks only, and mask=None sets both: "
                                         "pass mask='full'"):
        tf.set_schedule("shift")
    with pytest.raises(ValueError, match="schedule='symmetric_shift' is defined for causal masks only"):
        tf.set_schedule("symmetric_shift", mask="full")
    with pytest.raises(ValueError, match="mask must be None \\(both masks\\), 'full' or 'causal', got 'dense'"):
        tf.set_schedule("auto", mask="dense")
    assert tf.get_schedule(False) == tf.get_schedule(True) == "auto"  # nothing changed by refused calls
    tf.set_schedule("descending", mask="causal")
    assert (tf.get_schedule(False), tf.get_schedule(True)) == ("auto", "descending")


# --- layouts -----------------------------------------------------------------------------------------------------


def test_kernel_ready_layouts():
    t = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    assert tf._kernel_ready(t) and tf._kernel_ready(t.transpose(1, 2))
    assert tf._in_kernel_layout(t) is t
    for bad in (t[0, 0, 0].expand(2, 16, 4, 64),  # stride 0
                torch.randn(2, 16, 64, 4, dtype=t.dtype).transpose(2, 3),  # last dim not contiguous
                torch.randn(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape),  # base 2 bytes off alignment
                torch.randn(2, 16, 4, 68, dtype=t.dtype)[..., :64]):  # 136-byte row stride
        assert not tf._kernel_ready(bad)
        copy = tf._in_kernel_layout(bad)
        assert tf._kernel_ready(copy) and torch.equal(copy, bad)


# --- registration ------------------------------------------------------------------------------------------------


def _our_cuda_kernel(op="aten::_scaled_dot_product_flash_attention") -> bool:
    """Whether the op's CUDA kernel is ours (the dispatcher names the file that registered it)."""
    lines = [line for line in torch._C._dispatch_dump(op).splitlines() if line.startswith("CUDA:")]
    return any("torch_flash.py" in line for line in lines)


def test_register_activate_restore_round_trip():
    tf.register()
    tf.register()
    assert attention.list_flash_attention_impls().count(tf.IMPL_NAME) == 1
    assert attention.current_flash_attention_impl() is None and not _our_cuda_kernel()
    tf.activate()
    tf.activate()  # torch restores the previous activation first
    assert attention.current_flash_attention_impl() == tf.IMPL_NAME
    assert all(_our_cuda_kernel(f"aten::{op}") for op in tf._ATEN_IMPLS)
    # Only CUDA kernels are replaced: CPU SDPA still runs torch's own kernel (math on these inputs).
    q, k, v = sdpa_inputs(d=40)  # a head dim we have no kernel for, so our code cannot have run
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v),
                               torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(40), dim=-1) @ v)
    attention.restore_flash_attention_impl()
    assert attention.current_flash_attention_impl() is None
    assert not any(_our_cuda_kernel(f"aten::{op}") for op in tf._ATEN_IMPLS)


def test_activation_replaces_another_impl_and_back(monkeypatch):
    monkeypatch.setitem(attention._registry._FLASH_ATTENTION_IMPLS, "test-other", lambda: None)
    tf.activate()
    attention.activate_flash_attention_impl("test-other")  # restores ours first
    assert not _our_cuda_kernel()
    tf.activate()
    assert _our_cuda_kernel()


def test_missing_hook_names_the_torch_version(monkeypatch):
    monkeypatch.delattr(attention, "register_flash_attention_impl")
    for fn in (tf.register, tf.activate):
        with pytest.raises(RuntimeError, match=re.escape(f"torch {torch.__version__} has no "
                                                         "torch.nn.attention.register_flash_attention_impl")):
            fn()



# --- ragged inputs (varlen_attn) ---------------------------------------------------------------------------------

LENS_Q, LENS_K = [17, 0, 30, 9], [23, 5, 30, 0]  # an empty sequence, and one with queries but no keys


def ragged(heads_k=2, head_dim=64):
    pack = make_pack(LENS_Q, LENS_K, heads=4, heads_k=heads_k, head_dim=head_dim, dtype=torch.float64, seed=3)
    return pack, cu_seqlens(LENS_Q), cu_seqlens(LENS_K), max(LENS_Q), max(LENS_K)


def ours_varlen(pack, cu_q, cu_k, max_q, max_k, causal, dout):
    out, lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k, causal=causal,
                                      return_lse=True)
    return out, lse, torch.autograd.grad(out, (pack.q, pack.k, pack.v), dout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_k", [4, 1])
def test_ragged_matches_flash_attn_varlen_func(causal, heads_k):
    pack, cu_q, cu_k, max_q, max_k = ragged(heads_k=heads_k)
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    dout = torch.randn(q.shape, dtype=q.dtype)
    result = tf.flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=0.1)
    out, lse, rng_state, unused, _ = result
    ref_out, ref_lse = flash_attn_varlen_func(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k, softmax_scale=0.1,
                                              causal=causal, return_lse=True)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse)
    meta = aten._flash_attention_forward(*to_meta(q, k, v, cu_q, cu_k), max_q, max_k, 0.0, causal, False, scale=0.1)
    assert_like_meta(result, meta)
    grads = tf.flash_attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, causal, rng_state,
                                        unused, scale=0.1)
    for g, e in zip(grads, torch.autograd.grad(ref_out, (pack.q, pack.k, pack.v), dout)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)
    assert_like_meta(grads, aten._flash_attention_backward(*to_meta(dout, q, k, v, out, lse, cu_q, cu_k), max_q,
                                                           max_k, 0.0, causal, *to_meta(rng_state, unused),
                                                           scale=0.1))


def test_ragged_outputs_are_laid_out_like_the_inputs():
    """Our varlen forward op returns contiguous tensors; inputs with other (dense) strides get outputs and gradients
    laid out like them, as torch's meta kernels lay them out."""
    pack, cu_q, cu_k, max_q, max_k = ragged()
    q, k, v = (t.detach().transpose(0, 1).contiguous().transpose(0, 1)  # (total, heads, d) of (heads, total, d)
               for t in (pack.q, pack.k, pack.v))
    out, lse, rng_state, unused, _ = tf.flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, False, False)
    assert out.stride() == q.stride()
    dout = torch.randn(q.shape, dtype=q.dtype)
    grads = tf.flash_attention_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, 0.0, False, rng_state,
                                        unused)
    ref = flash_attn_varlen_func(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for g, e, t in zip(grads, torch.autograd.grad(ref, (pack.q, pack.k, pack.v), dout), (q, k, v)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)
        assert g.stride() == t.stride()


@pytest.mark.parametrize("window_size", [(-1, -1), (-1, 0)], ids=["full", "causal"])
def test_varlen_attn_through_the_dispatcher_and_autograd(cpu_kernels, window_size):
    """torch's varlen_attn (what TorchTitan's varlen attention calls): its custom op calls aten's flash forward,
    its autograd formula aten's flash backward; window_size=(-1, 0) is its causal mask."""
    pack, cu_q, cu_k, max_q, max_k = ragged()
    dout = torch.randn(pack.q.shape, dtype=pack.q.dtype)
    out, lse = varlen_attn(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k, window_size=window_size,
                           enable_gqa=True, return_aux=AuxRequest(lse=True))
    grads = torch.autograd.grad(out, (pack.q, pack.k, pack.v), dout)
    ref_out, ref_lse, ref_grads = ours_varlen(pack, cu_q, cu_k, max_q, max_k, window_size == (-1, 0), dout)
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, ref_lse)
    for g, e in zip(grads, ref_grads):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


def test_varlen_attn_sliding_window_through_the_dispatcher(cpu_kernels):
    """varlen_attn(window_size=(8, 0)): a band per sequence (bottom-right aligned), forward and backward."""
    pack, cu_q, cu_k, max_q, max_k = ragged()
    dout = torch.randn(pack.q.shape, dtype=pack.q.dtype)
    out = varlen_attn(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k, window_size=(8, 0), enable_gqa=True)
    grads = torch.autograd.grad(out, (pack.q, pack.k, pack.v), dout)
    ref = flash_attn_varlen_func(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k, window_size=(8, 0))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    assert not torch.allclose(out, flash_attn_varlen_func(pack.q, pack.k, pack.v, cu_q, cu_k, max_q, max_k,
                                                          causal=True))
    for g, e in zip(grads, torch.autograd.grad(ref, (pack.q, pack.k, pack.v), dout)):
        torch.testing.assert_close(g, e, atol=1e-12, rtol=1e-12)


def test_varlen_attn_out_writes_out(cpu_kernels):
    pack, cu_q, cu_k, max_q, max_k = ragged()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    out = torch.full_like(q, float("nan"))
    varlen_attn_out(out, q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0), enable_gqa=True)
    torch.testing.assert_close(out, flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True),
                               atol=1e-12, rtol=1e-12)


def test_ragged_seqused_k_limits_the_keys():
    pack, cu_q, cu_k, max_q, max_k = ragged()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    used = torch.tensor([10, 5, 30, 0], dtype=torch.int32)
    out = tf.flash_attention_forward(q, k, v, cu_q, cu_k, max_q, max_k, 0.0, True, False, seqused_k=used)[0]
    torch.testing.assert_close(out, flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=used,
                                                           causal=True), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("change, error, message", [
    (dict(cum_seq_q=torch.tensor([0, 17, 17, 47, 56])), TypeError, "cum_seq_q.dtype must be torch.int32"),
    (dict(cum_seq_k=cu_seqlens([23, 5, 30])), ValueError, "cum_seq_k must have the length of cum_seq_q"),
    (dict(max_q=20), ValueError, "max_q = 20 must bound every sequence's length, but sequence 2 has 30 tokens "
                                 "\\(cum_seq_q\\[3\\] - cum_seq_q\\[2\\]\\)"),
    (dict(max_k=0), ValueError, "max_k must be a positive int"),
    (dict(cum_seq_q=cu_seqlens([17, 0, 30, 8])), ValueError, "cum_seq_q\\[-1\\] must equal query.shape\\[0\\] = 56"),
    (dict(query=torch.zeros(56, 4, 2, 64, dtype=torch.float64)), ValueError, "query must be 3-D"),
    (dict(query=torch.zeros(56, 4, 96, dtype=torch.float64)), ValueError,
     "key.shape\\[2\\] \\(head_dim\\) must equal query"),
])
def test_ragged_refusals_name_atens_arguments(change, error, message):
    pack, cu_q, cu_k, max_q, max_k = ragged()
    args = dict(query=pack.q.detach(), key=pack.k.detach(), value=pack.v.detach(), cum_seq_q=cu_q, cum_seq_k=cu_k,
                max_q=max_q, max_k=max_k)
    args.update(change)
    with pytest.raises(error, match="^aten::_flash_attention_forward on flash_attn_dash: " + message):
        tf.flash_attention_forward(*args.values(), 0.0, False, False)


def test_ragged_head_dims_without_kernels_are_refused():
    pack, cu_q, cu_k, max_q, max_k = ragged(head_dim=32)
    with pytest.raises(ValueError, match="head_dim must be one of " + re.escape(str(checks.KERNEL_HEAD_DIMS))):
        tf.flash_attention_forward(pack.q.detach(), pack.k.detach(), pack.v.detach(), cu_q, cu_k, max_q, max_k, 0.0,
                                   False, False)


def test_ragged_backward_refuses_a_dense_logsumexp():
    pack, cu_q, cu_k, max_q, max_k = ragged()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    with pytest.raises(ValueError, match="logsumexp must be float32 of shape \\(4, 56\\)"):
        tf.flash_attention_backward(q, q, k, v, q, torch.zeros(1, 4, 56), cu_q, cu_k, max_q, max_k, 0.0, False, None,
                                    None)
