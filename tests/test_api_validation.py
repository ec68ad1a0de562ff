"""Every invalid input raises a TypeError/ValueError naming the argument, before anything runs."""
import re

import pytest
import torch

from flash_attn_dash import flash_attn_func


def qkv(b=1, sq=8, sk=8, h=2, hk=2, d=16, dtype=torch.float32):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        ({"schedule": "fastest"}, ValueError, "schedule must be one of 'auto', 'ascending'"),
        ({"schedule": 3}, ValueError, "schedule"),
        ({"schedule": "shift", "causal": True}, ValueError, "full masks only"),
        ({"schedule": "symmetric_shift"}, ValueError, "causal masks only"),
        # validated in both modes, with every valid schedule of the mask named
        ({"schedule": "shift", "causal": True, "deterministic": False}, ValueError,
         "valid for causal masks: 'auto', 'ascending', 'descending', 'symmetric_shift'"),
        ({"schedule": "symmetric_shift", "deterministic": False}, ValueError,
         "valid for full masks: 'auto', 'ascending', 'descending', 'shift'"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"deterministic": "yes"}, TypeError, "deterministic must be a bool"),
        ({"return_lse": None}, TypeError, "return_lse must be a bool"),
        ({"sm_margin": -1}, ValueError, "sm_margin must be >= 0"),
        ({"sm_margin": 1.5}, TypeError, "sm_margin must be an int"),
        ({"softmax_scale": "0.1"}, TypeError, "softmax_scale must be a float"),
        ({"softmax_scale": float("nan")}, ValueError, "softmax_scale must be finite"),
    ],
)
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        flash_attn_func(*qkv(), **kwargs)


def test_bad_tensors():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        flash_attn_func(q.numpy(), k, v)
    with pytest.raises(ValueError, match="q must be 4-D"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(TypeError, match=r"k.dtype must equal q.dtype"):
        flash_attn_func(q, k.double(), v)
    with pytest.raises(ValueError, match=r"v.shape\[:3\] \(batch, seqlen, heads\) must equal k.shape\[:3\] "
                                         r"\(1, 8, 2\), got \(1, 4, 2\) \(v may differ from k in head_dim only\)"):
        flash_attn_func(q, k, v[:, :4])
    with pytest.raises(ValueError, match=r"k.shape\[3\] \(head_dim\) must equal"):
        flash_attn_func(q, k[..., :8], v[..., :8])
    with pytest.raises(ValueError, match=r"k.shape\[0\] \(batch\)"):
        flash_attn_func(q, torch.cat([k, k]), torch.cat([v, v]))
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        flash_attn_func(*qkv(h=3, hk=2))
    with pytest.raises(TypeError, match="q.dtype must be one of"):
        flash_attn_func(*(t.to(torch.int32) for t in qkv()))


def test_validation_happens_before_compute(monkeypatch):
    import flash_attn_dash.interface as interface

    def boom(*a, **k):
        raise AssertionError("compute ran before validation")

    monkeypatch.setattr(interface._FlashAttnFunc, "apply", boom)
    with pytest.raises(ValueError, match="schedule"):
        flash_attn_func(*qkv(), schedule="nope")


def test_cpu_path_matches_reference_and_backprops():
    q, k, v = (t.requires_grad_() for t in qkv(sq=7, sk=11, h=4, hk=2))
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    from flash_attn_dash.reference import attention_ref

    ref, ref_lse = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(lse, ref_lse)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_cuda_tensors_without_kernels_give_clear_error():
    if torch.cuda.is_available():
        pytest.skip("only meaningful without a GPU")
    import flash_attn_dash._ext as ext

    if ext._C is not None:
        pytest.skip("extension present")
    with pytest.raises(RuntimeError, match="installed without its CUDA kernels"):
        ext.require_kernels()


def test_backward_schedule_used_reports_the_order_that_runs():
    from flash_attn_dash import backward_schedule_used

    q = torch.empty(1, 4096, 8, 128)
    assert backward_schedule_used(q, q, causal=True, schedule="symmetric_shift") == "symmetric_shift"
    k = torch.empty(1, 3000, 8, 128)  # seqlen_q != seqlen_k: symmetric_shift falls back
    assert backward_schedule_used(q, k, causal=True, schedule="symmetric_shift") == "descending"
    # Non-deterministic: causal walks the balanced pair grid where it applies, else descending; full walks shift.
    assert backward_schedule_used(q, q, causal=True, deterministic=False, schedule="descending") == "symmetric_shift"
    assert backward_schedule_used(q, k, causal=True, deterministic=False) == "descending"
    assert backward_schedule_used(q, q, causal=False, deterministic=False, schedule="shift") == "shift"
    assert backward_schedule_used(q, q, causal=False, schedule="shift") == "shift"


def test_backward_schedule_used_validates_like_flash_attn_func():
    from flash_attn_dash import backward_schedule_used

    q = torch.empty(1, 64, 2, 64)
    with pytest.raises(ValueError, match=r"q must be 4-D \(batch, seqlen, heads, head_dim\)"):
        backward_schedule_used(q[0], q)
    with pytest.raises(ValueError, match=r"k must be 4-D"):
        backward_schedule_used(q, q[0])
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        backward_schedule_used(q, None)
    with pytest.raises(ValueError, match="head_dim"):
        backward_schedule_used(q, torch.empty(1, 64, 2, 32))
    with pytest.raises(ValueError, match=r"q heads \(2\) must be a multiple of k/v heads \(3\)"):
        backward_schedule_used(q, torch.empty(1, 64, 3, 64))
    with pytest.raises(TypeError, match="causal must be a bool"):
        backward_schedule_used(q, q, causal="yes")


def test_cpu_answers_what_a_gpu_build_accepts():
    """On CPU tensors flash_attn_func runs the reference for any head dim, while backward_schedule_used answers for the
    kernels: it refuses a head dim the variant table has no kernels for and an sm_margin that leaves no SM of the
    modelled H200, as the GPU build would."""
    from flash_attn_dash import backward_schedule_used, variants

    q, k, v = qkv(d=80)
    flash_attn_func(q, k, v, causal=True).sum()  # the reference takes it
    table = ", ".join(str(h.label) for h in variants.HEAD_DIMS)
    assert "(192, 128)" in table
    with pytest.raises(ValueError, match=rf"head_dim must be one of {re.escape(f'({table})')} for the kernels"):
        backward_schedule_used(q, k)
    q = torch.empty(1, 64, 2, 64)
    assert backward_schedule_used(q, q, sm_margin=131) in variants.SCHEDULE_NAMES
    with pytest.raises(ValueError, match="sm_margin must be < 132"):
        backward_schedule_used(q, q, sm_margin=132)
