"""The reference against naive per-row math, and its edge cases."""
import math

import pytest
import torch

from flash_attn_dash.reference import attention_ref, causal_mask


def naive_attention(q, k, v, scale, causal):
    """Row-by-row float64 softmax attention, the textbook definition."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, h, d, dtype=torch.float64)
    lse = torch.full((b, h, sq), -math.inf, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // hk)
            for i in range(sq):
                keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
                if not keys:
                    continue
                s = torch.stack([q[bi, i, hi].double() @ k[bi, j, kh].double() * scale for j in keys])
                lse[bi, hi, i] = torch.logsumexp(s, 0)
                p = torch.exp(s - lse[bi, hi, i])
                out[bi, i, hi] = sum(p[n] * v[bi, j, kh].double() for n, j in enumerate(keys))
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (5, 9), (9, 5), (7, 7)])
@pytest.mark.parametrize("h,hk", [(2, 2), (4, 2), (3, 1)])
def test_matches_naive(causal, sq, sk, h, hk):
    g = torch.Generator().manual_seed(sq * 100 + sk * 10 + h + causal)
    q = torch.randn(2, sq, h, 8, generator=g)
    k = torch.randn(2, sk, hk, 8, generator=g)
    v = torch.randn(2, sk, hk, 8, generator=g)
    out, lse = attention_ref(q, k, v, 0.3, causal)
    out_n, lse_n = naive_attention(q, k, v, 0.3, causal)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), out_n, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_n, atol=1e-5, rtol=1e-5)


def test_rows_without_keys_are_zero_with_minus_inf_lse():
    q, k, v = torch.randn(1, 6, 2, 8), torch.randn(1, 2, 2, 8), torch.randn(1, 2, 2, 8)
    out, lse = attention_ref(q, k, v, causal=True)
    # sq=6, sk=2: rows 0..3 see no key (bottom-right alignment).
    assert torch.all(out[:, :4] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :4]))
    assert torch.all(torch.isfinite(lse[:, :, 4:]))


def test_gradients_finite_with_empty_rows_and_match_gradcheck():
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 1, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 3, 1, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: attention_ref(q, k, v, 0.5, True)[0], (q, k, v))
    out, _ = attention_ref(q, k, v, causal=True)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16), torch.randn(1, 4, 1, 16)
    torch.testing.assert_close(attention_ref(q, k, v)[0], attention_ref(q, k, v, 16**-0.5)[0])


def test_low_precision_path_stays_in_input_dtype():
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    out, lse = attention_ref(q, k, v, upcast=False)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref, _ = attention_ref(q, k, v)
    assert (out.float() - ref).abs().max() < 5e-2


def test_causal_mask_bottom_right():
    m = causal_mask(2, 4)
    assert m.tolist() == [[True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk,h,hk", [(7, 7, 2, 2), (9, 4, 4, 2), (3, 10, 3, 1)])
def test_explicit_backward_matches_autograd(causal, sq, sk, h, hk):
    from flash_attn_dash.reference import attention_ref_bwd

    q = torch.randn(2, sq, h, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, sk, hk, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, sk, hk, 8, dtype=torch.float64, requires_grad=True)
    out, _ = attention_ref(q, k, v, 0.7, causal)
    dout = torch.randn_like(out)
    expected = torch.autograd.grad(out, (q, k, v), dout)
    got = attention_ref_bwd(dout, q, k, v, 0.7, causal)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
