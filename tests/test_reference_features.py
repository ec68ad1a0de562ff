"""The reference's sliding window, softcap and learnable sinks: masks against a brute-force loop, outputs against
row-by-row math, fp64 gradcheck of every feature and combination, the explicit backward (dsink included) against
autograd, and the edge cases (rows that see no key, seqlen_q != seqlen_k, GQA)."""
import itertools
import math

import pytest
import torch

from flash_attn_dash.reference import (RefGrads, attention_ref, attention_ref_bwd, attention_ref_grads, causal_mask,
                                       visible_mask)
from flash_attn_dash.schedule.tiles import canonical_window

WINDOWS = [(-1, -1), (0, 0), (0, -1), (-1, 0), (1, 2), (3, -1), (-1, 3), (2, 0), (7, 7), (20, 20)]
SHAPES = [(1, 1), (5, 9), (9, 5), (7, 7), (6, 2)]


def brute_visible(sq: int, sk: int, causal: bool, window: tuple[int, int]) -> list[list[bool]]:
    """The window rule written out per (i, j), independently of the tensor code."""
    left, right = window
    if causal:
        right = 0
    out = []
    for i in range(sq):
        diagonal = i + sk - sq
        out.append([(left < 0 or j >= diagonal - left) and (right < 0 or j <= diagonal + right) for j in range(sk)])
    return out


def naive_attention(q, k, v, scale, causal, window, softcap, sink):
    """Row-by-row float64 attention with the features applied in their textbook order."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, h, v.shape[3], dtype=torch.float64)
    lse = torch.full((b, h, sq), -math.inf, dtype=torch.float64)
    allowed = brute_visible(sq, sk, causal, window)
    for bi, hi, i in itertools.product(range(b), range(h), range(sq)):
        kh = hi // (h // hk)
        keys = [j for j in range(sk) if allowed[i][j]]
        logits = [float(q[bi, i, hi].double() @ k[bi, j, kh].double()) * scale for j in keys]
        if softcap:
            logits = [softcap * math.tanh(x / softcap) for x in logits]
        columns = logits + ([float(sink[hi])] if sink is not None else [])
        if not columns:
            continue
        top = max(columns)
        lse[bi, hi, i] = top + math.log(sum(math.exp(x - top) for x in columns))
        for x, j in zip(logits, keys):
            out[bi, i, hi] += math.exp(x - lse[bi, hi, i]) * v[bi, j, kh].double()
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("sq,sk", SHAPES)
def test_visible_mask_matches_brute_force(causal, window, sq, sk):
    got = visible_mask(sq, sk, causal, window)
    assert got.dtype == torch.bool and got.tolist() == brute_visible(sq, sk, causal, window)
    # The schedule model's canonical spelling of the mask sees the same keys.
    assert torch.equal(visible_mask(sq, sk, False, canonical_window(causal, window, sq, sk)), got)


def test_causal_mask_is_the_causal_visible_mask():
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert torch.equal(causal_mask(9, 5), visible_mask(9, 5, False, (-1, 0)))
    assert torch.equal(visible_mask(4, 4, True, (1, 5)), visible_mask(4, 4, False, (1, 0)))  # causal: right = 0


def _inputs(sq, sk, h, hk, d=8, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, sq, h, d, generator=g, dtype=dtype)
    k = torch.randn(2, sk, hk, d, generator=g, dtype=dtype)
    v = torch.randn(2, sk, hk, d, generator=g, dtype=dtype)
    sink = torch.randn(h, generator=g, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v, sink)]


@pytest.mark.parametrize("causal,window", [(False, (2, 1)), (True, (3, -1)), (False, (-1, 0)), (False, (0, 0)),
                                           (True, (-1, -1))])
@pytest.mark.parametrize("softcap", [0.0, 0.7])
@pytest.mark.parametrize("use_sink", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk", [(7, 7, 2, 2), (9, 4, 4, 2), (3, 10, 3, 1)])
def test_matches_naive(causal, window, softcap, use_sink, sq, sk, h, hk):
    q, k, v, sink = _inputs(sq, sk, h, hk, seed=sq * 10 + sk)
    sink = sink if use_sink else None
    out, lse = attention_ref(q, k, v, 0.4, causal, window_size=window, softcap=softcap, learnable_sink=sink)
    out_n, lse_n = naive_attention(q, k, v, 0.4, causal, window, softcap, sink)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), out_n, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_n, atol=1e-5, rtol=1e-5)


def test_rows_without_keys():
    """sq=6, sk=2, window (0, 0): row i sees only key i - 4, so rows 0..3 see none.  Without a sink they give 0 and
    -inf, with a sink 0 and lse = sink."""
    q, k, v, sink = _inputs(6, 2, 2, 2)
    out, lse = attention_ref(q, k, v, window_size=(0, 0))
    assert torch.all(out[:, :4] == 0) and torch.all(torch.isneginf(lse[:, :, :4]))
    assert torch.all(torch.isfinite(lse[:, :, 4:]))
    out_s, lse_s = attention_ref(q, k, v, window_size=(0, 0), learnable_sink=sink)
    assert torch.all(out_s[:, :4] == 0)
    torch.testing.assert_close(lse_s[:, :, :4], sink.view(1, 2, 1).expand(2, 2, 4))
    # The rows that see their one key share it with the sink: out = v * sigmoid(score - sink).
    assert torch.all(out_s[:, 4:].abs() < out[:, 4:].abs())


def test_sink_edge_values():
    q, k, v, sink = _inputs(5, 7, 2, 1)
    plain = attention_ref(q, k, v, causal=True)
    none = attention_ref(q, k, v, causal=True, learnable_sink=torch.full((2,), -math.inf))
    torch.testing.assert_close(none, plain)  # a sink of -inf is no sink
    drowned, lse = attention_ref(q, k, v, causal=True, learnable_sink=torch.full((2,), 80.0))
    assert drowned.abs().max() < 1e-20 and torch.allclose(lse, torch.full_like(lse, 80.0))


def test_softcap_limits():
    q, k, v, _ = _inputs(6, 6, 2, 2)
    q = q * 10  # large scores, so the cap matters
    torch.testing.assert_close(attention_ref(q, k, v, softcap=1e6), attention_ref(q, k, v), atol=1e-4, rtol=1e-4)
    # One-hot values make out the probabilities.  Capped at 0.5, scores lie in [-0.5, 0.5], so the probabilities of
    # a row are within a factor e of each other; uncapped they are not.
    onehot = torch.eye(6).view(1, 6, 1, 6).expand(2, 6, 2, 6)
    capped, _ = attention_ref(q, k, onehot, 1.0, softcap=0.5)
    uncapped, _ = attention_ref(q, k, onehot, 1.0)
    torch.testing.assert_close(capped.sum(-1), torch.ones(2, 6, 2))
    assert (capped.amax(-1) / capped.amin(-1)).max() <= math.e * (1 + 1e-6)  # scores saturate at the cap
    assert (uncapped.amax(-1) / uncapped.amin(-1)).max() > math.e


FEATURES = [
    {"window_size": (2, 1)}, {"window_size": (1, -1)}, {"window_size": (-1, 2)},
    {"causal": True, "window_size": (2, 0)},
    {"softcap": 0.8}, {"learnable_sink": True},
    {"window_size": (1, 1), "softcap": 0.6}, {"causal": True, "learnable_sink": True},
    {"window_size": (0, 1), "learnable_sink": True}, {"softcap": 0.5, "learnable_sink": True},
    {"causal": True, "window_size": (3, 0), "softcap": 0.9, "learnable_sink": True},
]


def _call(features, sink):
    kwargs = {key: value for key, value in features.items() if key != "learnable_sink"}
    causal = kwargs.pop("causal", False)
    return causal, {**kwargs, "learnable_sink": sink if features.get("learnable_sink") else None}


@pytest.mark.parametrize("features", FEATURES, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
@pytest.mark.parametrize("sq,sk,h,hk", [(5, 5, 2, 2), (6, 3, 2, 1), (3, 6, 4, 2)])
def test_gradcheck_fp64(features, sq, sk, h, hk):
    q, k, v, sink = _inputs(sq, sk, h, hk, d=4, dtype=torch.float64, seed=sq + 7 * sk, grad=True)
    causal, kwargs = _call(features, sink)
    inputs = (q, k, v, sink) if kwargs["learnable_sink"] is not None else (q, k, v)

    def f(q, k, v, sink=None):
        out, lse = attention_ref(q, k, v, 0.6, causal, **{**kwargs, "learnable_sink": sink})
        # lse is -inf on rows with no key and no sink; gradcheck needs finite outputs.
        return out, torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("features", FEATURES + [{}, {"causal": True}],
                         ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()) or "plain")
@pytest.mark.parametrize("sq,sk,h,hk", [(7, 7, 2, 2), (9, 4, 4, 2), (3, 10, 3, 1)])
def test_explicit_backward_matches_autograd(features, sq, sk, h, hk):
    q, k, v, sink = _inputs(sq, sk, h, hk, dtype=torch.float64, seed=3 * sq + sk, grad=True)
    causal, kwargs = _call(features, sink)
    out, lse = attention_ref(q, k, v, 0.7, causal, **kwargs)
    dout = torch.randn_like(out)
    wrt = (q, k, v) + ((sink,) if kwargs["learnable_sink"] is not None else ())
    expected = torch.autograd.grad(out, wrt, dout)
    got = attention_ref_grads(dout, q, k, v, 0.7, causal, **kwargs)
    assert isinstance(got, RefGrads)
    for g, e in zip((got.dq, got.dk, got.dv), expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)
    if kwargs["learnable_sink"] is None:
        assert got.dsink is None
    else:
        assert got.dsink.shape == (h,) and got.dsink.dtype == torch.float64
        torch.testing.assert_close(got.dsink, expected[3])
    # The three-tensor form existing callers use.
    assert all(torch.equal(a, b) for a, b in zip(attention_ref_bwd(dout, q, k, v, 0.7, causal, **kwargs),
                                                 (got.dq, got.dk, got.dv)))


def test_dsink_is_fp32_for_low_precision_inputs():
    q, k, v, sink = _inputs(4, 4, 2, 2, dtype=torch.bfloat16)
    grads = attention_ref_grads(torch.randn_like(q), q, k, v, learnable_sink=sink.float(), window_size=(1, 0))
    assert grads.dsink.dtype == torch.float32 and grads.dq.dtype == torch.bfloat16


def test_gradients_finite_on_rows_without_keys():
    q, k, v, sink = _inputs(6, 2, 2, 2, dtype=torch.float64, grad=True)
    for use_sink in (False, True):
        out, _ = attention_ref(q, k, v, window_size=(0, 0), learnable_sink=sink if use_sink else None)
        grads = torch.autograd.grad(out.sum(), (q, k, v, sink) if use_sink else (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)
        assert torch.all(grads[0][:, :4] == 0)  # rows that see nothing get no dq


@pytest.mark.parametrize("kwargs, message", [
    ({"window_size": (-2, 0)}, "window_size"), ({"window_size": (1,)}, "window_size"),
    ({"window_size": (1.0, 2)}, "window_size"), ({"softcap": -1.0}, "softcap"), ({"softcap": math.inf}, "softcap"),
    ({"learnable_sink": torch.zeros(3)}, r"learnable_sink.*\(2,\)"),
    ({"learnable_sink": torch.zeros(2, dtype=torch.int64)}, "floating-point"),
])
def test_bad_feature_arguments(kwargs, message):
    q, k, v, _ = _inputs(3, 3, 2, 2)
    with pytest.raises(ValueError, match=message):
        attention_ref(q, k, v, **kwargs)
    with pytest.raises(ValueError, match=message):
        attention_ref_grads(q, q, k, v, **kwargs)
