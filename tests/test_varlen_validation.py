"""Every invalid varlen argument raises a TypeError/ValueError naming it and what is accepted, before any compute."""
import re

import pytest
import torch
from varlen_packs import cu_seqlens, make_pack

import flash_attn_dash.varlen as varlen
import flash_attn_dash.varlen_per_sequence as per_sequence
from flash_attn_dash import checks, flash_attn_varlen_func, varlen_schedule_used

I32 = torch.int32


def call(pack=None, q=None, k=None, v=None, **overrides):
    """flash_attn_varlen_func on a valid 3-sequence pack, with some arguments replaced."""
    pack = pack or make_pack([3, 4, 2], [5, 4, 1])
    kwargs = {**pack.args(), **overrides}
    return flash_attn_varlen_func(pack.q if q is None else q, pack.k if k is None else k,
                                  pack.v if v is None else v, **kwargs)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [  # the options are flash_attn_func's, checked by the same function
        ({"schedule": "fastest"}, ValueError, "schedule must be one of 'auto', 'ascending'"),
        ({"schedule": "shift", "causal": True}, ValueError, "full masks only"),
        ({"schedule": "symmetric_shift", "deterministic": False}, ValueError, "causal masks only"),
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"deterministic": "yes"}, TypeError, "deterministic must be a bool"),
        ({"return_lse": None}, TypeError, "return_lse must be a bool"),
        ({"sm_margin": -1}, ValueError, "sm_margin must be >= 0"),
        ({"sm_margin": 1.5}, TypeError, "sm_margin must be an int"),
        ({"softmax_scale": "0.1"}, TypeError, "softmax_scale must be a float"),
        ({"softmax_scale": float("inf")}, ValueError, "softmax_scale must be finite"),
    ],
)
def test_bad_options(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        call(**kwargs)


def test_q_k_v_must_be_tensors():
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got ndarray"):
        call(pack, q=pack.q.detach().numpy())
    with pytest.raises(TypeError, match="v must be a torch.Tensor, got list"):
        call(pack, v=[1.0])


def test_q_k_v_must_be_3d():
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(ValueError, match=r"q must be 3-D \(total_q, heads, head_dim\), got shape \(1, 9, 4, 16\)"):
        call(pack, q=pack.q.unsqueeze(0))
    with pytest.raises(ValueError, match=r"k must be 3-D \(total_k, heads_k, head_dim\), got shape \(10, 32\)"):
        call(pack, k=pack.k.flatten(1))


def test_v_tokens_and_heads_must_equal_ks():
    """v may differ from k in its head dim only (MLA)."""
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(ValueError, match=r"v.shape\[:2\] \(total_k, heads_k\) must equal k.shape\[:2\] \(10, 2\), "
                                         r"got \(9, 2\) \(v may differ from k in head_dim only\)"):
        call(pack, v=pack.v[:9])


def test_head_dims_must_match():
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(ValueError, match=r"k.shape\[2\] \(head_dim\) must equal q.shape\[2\] = 16, got 8"):
        call(pack, k=pack.k[..., :8], v=pack.v[..., :8])


def test_dtypes_and_devices_as_flash_attn_func():
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(TypeError, match=r"k.dtype must equal q.dtype \(torch.float32\), got torch.float64"):
        call(pack, k=pack.k.double())
    with pytest.raises(ValueError, match=r"v must be on q's device \(cpu\), got meta"):
        call(pack, v=pack.v.to("meta"))
    ints = [t.detach().to(I32) for t in (pack.q, pack.k, pack.v)]
    with pytest.raises(TypeError, match="q.dtype must be one of .*float64 on cpu, got torch.int32"):
        call(pack, *ints)


def test_gqa_ratio():
    pack = make_pack([3, 4, 2], [5, 4, 1], heads=3, heads_k=2)
    with pytest.raises(ValueError, match=r"q heads \(3\) must be a multiple of k/v heads \(2\)"):
        call(pack)


def test_32bit_element_limit_names_the_tensor():
    big = torch.zeros(1, 1, 1).expand(2**31, 1, 1)
    small = torch.zeros(4, 1, 1)
    cu = cu_seqlens([4])
    with pytest.raises(ValueError, match=r"q has 2147483648 tokens x 1 heads x 1 head_dim = 2147483648 elements; "
                                         r".*32-bit offsets, so it must be < 2\*\*31 = 2147483648"):
        flash_attn_varlen_func(big, small, small, cu, cu, 4, 4)
    big_kv = torch.zeros(1, 2, 1).expand(2**30, 2, 1)
    with pytest.raises(ValueError, match=r"k has 1073741824 tokens x 2 heads x 1 head_dim = 2147483648 elements"):
        flash_attn_varlen_func(torch.zeros(4, 2, 1), big_kv, big_kv, cu, cu, 4, 4)
    # one element below the limit passes this check (and fails the next one, the totals)
    with pytest.raises(ValueError, match="max_seqlen_q = 4 must bound every sequence's length, but q packs "
                                         "2147483647 tokens"):
        flash_attn_varlen_func(torch.zeros(1, 1, 1).expand(2**31 - 1, 1, 1), small, small, cu, cu, 4, 4)


def test_cu_seqlens_type_dtype_shape_device():
    with pytest.raises(TypeError, match=r"cu_seqlens_q must be a torch.Tensor \(int32, shape \(batch \+ 1,\)\), "
                                        "got list"):
        call(cu_seqlens_q=[0, 3, 7, 9])
    with pytest.raises(TypeError, match="cu_seqlens_k.dtype must be torch.int32, got torch.int64"):
        call(cu_seqlens_k=cu_seqlens([5, 4, 1]).long())
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be 1-D of length batch \+ 1 >= 1, got shape \(1, 4\)"):
        call(cu_seqlens_q=cu_seqlens([3, 4, 2]).unsqueeze(0))
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be 1-D of length batch \+ 1 >= 1, got shape \(0,\)"):
        call(cu_seqlens_k=torch.zeros(0, dtype=I32))
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be on q's device \(cpu\), got meta"):
        call(cu_seqlens_k=cu_seqlens([5, 4, 1], "meta"))


def test_cu_seqlens_same_batch():
    with pytest.raises(ValueError, match=r"cu_seqlens_k must have the length of cu_seqlens_q \(batch \+ 1 = 4: the "
                                         r"same sequences\), got 3"):
        call(cu_seqlens_k=cu_seqlens([5, 5]))


def test_cu_seqlens_must_start_at_0():
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0, got 1"):
        call(cu_seqlens_q=torch.tensor([1, 3, 7, 9], dtype=I32))


def test_cu_seqlens_must_end_at_the_total():
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] must equal k.shape\[0\] = 10 \(the packed tokens\), "
                                         "got 9"):
        call(cu_seqlens_k=cu_seqlens([5, 3, 1]))


def test_cu_seqlens_must_be_non_decreasing():
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing, got cu_seqlens_q\[2\] = 2 < "
                                         r"cu_seqlens_q\[1\] = 5"):
        call(cu_seqlens_q=torch.tensor([0, 5, 2, 9], dtype=I32), max_seqlen_q=7)


def test_max_seqlen_must_bound_every_length():
    # total 9 <= 3 x 4, so only the values show that sequence 1 (4 tokens) exceeds max_seqlen_q = 3
    with pytest.raises(ValueError, match=r"max_seqlen_q = 3 must bound every sequence's length, but sequence 1 has "
                                         r"4 tokens \(cu_seqlens_q\[2\] - cu_seqlens_q\[1\]\)"):
        call(max_seqlen_q=3)
    # total 10 > 3 x 3: the shapes alone show it, no values read
    with pytest.raises(ValueError, match=r"max_seqlen_k = 3 must bound every sequence's length, but k packs 10 "
                                         r"tokens into 3 sequences \(more than batch x max_seqlen_k = 9\)"):
        call(max_seqlen_k=3)


@pytest.mark.parametrize("value,exc,match", [
    (True, TypeError, "max_seqlen_k must be a positive int, got bool"),
    (5.0, TypeError, "max_seqlen_k must be a positive int, got float"),
    (torch.tensor(5), TypeError, "max_seqlen_k must be a positive int, got Tensor"),
    (0, ValueError, r"max_seqlen_k must be a positive int \(>= 1\), got 0"),
])
def test_max_seqlen_is_a_positive_int(value, exc, match):
    with pytest.raises(exc, match=match):
        call(max_seqlen_k=value)


def test_seqused_type_dtype_shape_device():
    with pytest.raises(TypeError, match=r"seqused_q must be None or a torch.Tensor \(int32, shape \(batch,\)\), "
                                        "got list"):
        call(seqused_q=[1, 2, 3])
    with pytest.raises(TypeError, match="seqused_k.dtype must be torch.int32, got torch.int64"):
        call(seqused_k=torch.tensor([1, 2, 1]))
    with pytest.raises(ValueError, match=r"seqused_q must have shape \(batch,\) = \(3,\), got \(4,\)"):
        call(seqused_q=torch.tensor([1, 2, 1, 0], dtype=I32))
    with pytest.raises(ValueError, match=r"seqused_k must be on q's device \(cpu\), got meta"):
        call(seqused_k=torch.tensor([1, 2, 1], dtype=I32, device="meta"))


@pytest.mark.parametrize("used,match", [
    ([1, 5, 1], r"seqused_k\[1\] must be in \[0, 4\] \(sequence 1's length in cu_seqlens_k\), got 5"),
    ([1, 2, -1], r"seqused_k\[2\] must be in \[0, 1\] \(sequence 2's length in cu_seqlens_k\), got -1"),
])
def test_seqused_values_within_the_sequence(used, match):
    with pytest.raises(ValueError, match=match):
        call(seqused_k=torch.tensor(used, dtype=I32))


def test_shape_errors_come_before_compute(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("compute ran before validation")

    monkeypatch.setattr(varlen._FlashAttnVarlenFunc, "apply", boom)
    with pytest.raises(ValueError, match="cu_seqlens_k must have the length"):
        call(cu_seqlens_k=cu_seqlens([10]))


def test_value_errors_come_before_compute(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("compute ran before validation")

    monkeypatch.setattr(per_sequence, "forward", boom)
    monkeypatch.setattr(per_sequence, "backward_into", boom)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0"):
        call(cu_seqlens_q=torch.tensor([2, 3, 7, 9], dtype=I32))
    pack = make_pack([3, 4, 2], [5, 4, 1])
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\]"):  # the backward op checks what it reads, too
        torch.ops.flash_attn_dash.varlen_bwd(pack.q, pack.q, pack.k, pack.v, pack.q, torch.zeros(4, 9),
                                             cu_seqlens([3, 4, 2]), cu_seqlens([5, 4, 2]), 4, 5, None, None, 0.25,
                                             False, True, "auto", 0)


def test_schedule_used_validates_like_the_main_function():
    pack = make_pack([3, 4, 2], [5, 4, 1], head_dim=64)
    args = pack.args()
    with pytest.raises(ValueError, match="schedule must be one of"):
        varlen_schedule_used(pack.q, pack.k, **args, schedule="fastest")
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got NoneType"):
        varlen_schedule_used(pack.q, None, **args)
    with pytest.raises(TypeError, match="cu_seqlens_q.dtype must be torch.int32"):
        varlen_schedule_used(pack.q, pack.k, **{**args, "cu_seqlens_q": args["cu_seqlens_q"].long()})
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[0\] must be 0"):
        varlen_schedule_used(pack.q, pack.k, **{**args, "cu_seqlens_k": torch.tensor([1, 5, 9, 10], dtype=I32)})
    with pytest.raises(ValueError, match=r"seqused_q\[0\] must be in \[0, 3\]"):
        varlen_schedule_used(pack.q, pack.k, **{**args, "seqused_q": torch.tensor([4, 0, 0], dtype=I32)})
    # what a GPU build would raise
    with pytest.raises(ValueError, match="sm_margin must be < 132"):
        varlen_schedule_used(pack.q, pack.k, **args, sm_margin=132)
    small = make_pack([3, 4, 2], [5, 4, 1], head_dim=16)
    with pytest.raises(ValueError, match="head_dim must be one of " + re.escape(str(checks.KERNEL_HEAD_DIMS)) + " for the kernels"):
        varlen_schedule_used(small.q, small.k, **args)
