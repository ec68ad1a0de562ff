"""torch's own entry points on our kernels (flash_attn_dash.integrations.torch_flash activated), on the GPU.

F.scaled_dot_product_attention on the flash backend must give the bits flash_attn_func gives on the transposed
tensors, forward and backward (deterministic through torch's switch: same kernels, same order), also under
torch.compile, and varlen_attn the bits of flash_attn_varlen_func; restore_flash_attention_impl() must hand the ops
back to torch's kernels.
"""
import inspect

import pytest
import torch
import torch.nn.attention as attention
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from varlen_packs import cu_seqlens

from flash_attn_dash import flash_attn_func, flash_attn_varlen_func
from flash_attn_dash.integrations import torch_flash

pytestmark = pytest.mark.gpu
if not hasattr(attention, "register_flash_attention_impl"):
    pytest.skip(f"torch {torch.__version__} has no flash-attention hook", allow_module_level=True)

from torch.nn.attention.varlen import AuxRequest, varlen_attn  # noqa: E402

varlen_attn_out = getattr(torch.nn.attention.varlen, "varlen_attn_out", None)


@pytest.fixture(autouse=True)
def ours_deterministic():
    torch_flash.activate()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)
    if attention.current_flash_attention_impl() == torch_flash.IMPL_NAME:
        attention.restore_flash_attention_impl()


def _sdpa_leaves(b, s_q, s_k, h, hk, d, seed):
    """SDPA-layout leaves that are transposes of (batch, seqlen, heads, head_dim) memory, as projections give them."""
    g = torch.Generator("cuda").manual_seed(seed)
    return tuple(torch.randn(b, s, heads, d, generator=g, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
                 .requires_grad_() for s, heads in ((s_q, h), (s_k, hk), (s_k, hk)))


def _ours(q, k, v, dout, causal):
    """flash_attn_func on the same memory in our layout, deterministic."""
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    out = flash_attn_func(*leaves, causal=causal, deterministic=True)
    grads = torch.autograd.grad(out, leaves, dout.transpose(1, 2))
    return out.transpose(1, 2), [g.transpose(1, 2) for g in grads]


def _sdpa(q, k, v, dout, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return out, torch.autograd.grad(out, (q, k, v), dout)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,s,h,hk,d", [(2, 1024, 8, 8, 128), (1, 1000, 6, 2, 64), (2, 333, 4, 1, 128)])
def test_sdpa_flash_backend_gives_flash_attn_func_bits(b, s, h, hk, d, causal):
    q, k, v = _sdpa_leaves(b, s, s, h, hk, d, seed=s)
    dout = torch.randn_like(q)
    out, grads = _sdpa(q, k, v, dout, causal)
    ref, ref_grads = _ours(q, k, v, dout, causal)
    assert torch.equal(out, ref)
    assert out.stride() == q.stride()  # laid out like query, as torch's meta kernel says
    for g, r, leaf in zip(grads, ref_grads, (q, k, v)):
        assert torch.equal(g, r)
        assert g.stride() == leaf.stride()


def test_sdpa_backward_is_bitwise_repeatable():
    q, k, v = _sdpa_leaves(2, 2048, 2048, 8, 8, 128, seed=7)
    dout = torch.randn_like(q)
    first = _sdpa(q, k, v, dout, True)[1]
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, _sdpa(q, k, v, dout, True)[1]))


def test_sdpa_under_torch_compile_gives_eager_bits():
    """Inductor runs the aten op as a fallback and checks its outputs against torch's meta kernel (sizes, strides)."""
    q, k, v = _sdpa_leaves(2, 512, 512, 4, 4, 64, seed=3)
    dout = torch.randn_like(q)
    compiled = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                             fullgraph=True)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = compiled(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref, ref_grads = _sdpa(q, k, v, dout, True)
    assert torch.equal(out, ref)
    assert all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


def test_unsupported_sdpa_arguments_raise_and_restore_hands_back_torchs_kernel():
    q, k, v = _sdpa_leaves(1, 256, 256, 2, 2, 64, seed=5)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(ValueError, match="aten::_scaled_dot_product_flash_attention on flash_attn_dash: "
                                             "dropout_p must be 0.0"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
        attention.restore_flash_attention_impl()
        assert attention.current_flash_attention_impl() is None
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)  # torch's flash kernel has dropout
    assert out.shape == q.shape and torch.isfinite(out).all()


def _varlen_pack(heads, heads_k, d, seed):
    lens_q, lens_k = [700, 0, 1100, 33], [900, 64, 1100, 0]  # an empty sequence, one with queries but no keys
    g = torch.Generator("cuda").manual_seed(seed)
    q, k, v = (torch.randn(sum(lens), h, d, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
               for lens, h in ((lens_q, heads), (lens_k, heads_k), (lens_k, heads_k)))
    return q, k, v, cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda"), max(lens_q), max(lens_k)


@pytest.mark.parametrize("window_size", [(-1, -1), (-1, 0)], ids=["full", "causal"])
@pytest.mark.parametrize("heads,heads_k,d", [(8, 8, 128), (6, 2, 64)])
def test_varlen_attn_gives_flash_attn_varlen_func_bits(heads, heads_k, d, window_size):
    gqa = {"enable_gqa": True} if heads != heads_k else {}
    if gqa and "enable_gqa" not in inspect.signature(varlen_attn).parameters:
        pytest.skip(f"torch {torch.__version__}'s varlen_attn has no enable_gqa")
    q, k, v, cu_q, cu_k, max_q, max_k = _varlen_pack(heads, heads_k, d, seed=d)
    dout = torch.randn_like(q)
    out, lse = varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, window_size=window_size,
                           return_aux=AuxRequest(lse=True), **gqa)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = flash_attn_varlen_func(*leaves, cu_q, cu_k, max_q, max_k, causal=window_size == (-1, 0),
                                          deterministic=True, return_lse=True)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    for g, r in zip(grads, torch.autograd.grad(ref, leaves, dout)):
        assert torch.equal(g, r)


@pytest.mark.skipif(varlen_attn_out is None, reason=f"torch {torch.__version__} has no varlen_attn_out")
def test_varlen_attn_out_writes_the_forward_bits():
    q, k, v, cu_q, cu_k, max_q, max_k = _varlen_pack(4, 4, 128, seed=1)
    q, k, v = (t.detach() for t in (q, k, v))
    out = torch.full_like(q, float("nan"))
    varlen_attn_out(out, q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, 0))
    assert torch.equal(out, flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True))
