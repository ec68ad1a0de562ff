"""On the GPU: the features the sm90 kernels lack are refused before any launch, and windows that are the full or
causal mask run those kernels, bit for bit as the plain call."""
import pytest
import torch
from varlen_packs import cu_seqlens

from flash_attn_dash import (backward_schedule_used, flash_attn_func, flash_attn_kvpacked_func,
                             flash_attn_qkvpacked_func, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                             flash_attn_varlen_qkvpacked_func)

pytestmark = pytest.mark.gpu

LENS = [300, 0, 513, 77]


def _tensor(*shape, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_()


def _entry_points():
    q, k, v = (_tensor(2, 256, 4, 64, seed=i) for i in range(3))
    vq, vk, vv = (_tensor(sum(LENS), 4, 64, seed=i) for i in range(3))
    cu, m = cu_seqlens(LENS, "cuda"), max(LENS)
    return {
        "flash_attn_func": (lambda **kw: flash_attn_func(q, k, v, **kw), (q, k, v)),
        "flash_attn_varlen_func": (lambda **kw: flash_attn_varlen_func(vq, vk, vv, cu, cu, m, m, **kw), (vq, vk, vv)),
        "qkvpacked": (lambda **kw: flash_attn_qkvpacked_func(torch.stack([q, k, v], 2), **kw), (q, k, v)),
        "kvpacked": (lambda **kw: flash_attn_kvpacked_func(q, torch.stack([k, v], 2), **kw), (q, k, v)),
        "varlen_qkvpacked": (lambda **kw: flash_attn_varlen_qkvpacked_func(torch.stack([vq, vk, vv], 1), cu, m, **kw),
                             (vq, vk, vv)),
        "varlen_kvpacked": (lambda **kw: flash_attn_varlen_kvpacked_func(vq, torch.stack([vk, vv], 1), cu, cu, m, m,
                                                                         **kw), (vq, vk, vv)),
    }


def test_what_the_kernels_lack_is_refused_before_launch():
    """A softcap with a learnable sink has no kernel (variants.SOFTCAP_WITH): every entry point says so."""
    sink = torch.zeros(4, device="cuda")
    for name, (call, _) in _entry_points().items():
        with pytest.raises(NotImplementedError,
                           match=r"the sm90 kernels do not support softcap=30.0 with a learnable_sink"):
            call(softcap=30.0, learnable_sink=sink)


@pytest.mark.parametrize("window,causal,plain_causal", [
    ((-1, 0), False, True), ((600, 17), True, True), ((-1, 100000), True, True), ((600, 600), False, False),
])
def test_windows_that_are_a_mask_give_the_plain_calls_bits(window, causal, plain_causal):
    for name, (call, leaves) in _entry_points().items():
        runs = []
        for kwargs in (dict(causal=plain_causal), dict(causal=causal, window_size=window)):
            out = call(deterministic=True, **kwargs)
            grads = torch.autograd.grad(out.float().square().sum(), leaves)
            runs.append([t.view(torch.int16) for t in (out, *grads)])
        assert all(torch.equal(a, b) for a, b in zip(*runs)), name


def test_schedule_used_follows_the_mask_a_window_is():
    q = torch.empty(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    assert backward_schedule_used(q, q, window_size=(-1, 0)) == backward_schedule_used(q, q, causal=True)
    assert backward_schedule_used(q, q, window_size=(128, 0)) == "descending"
    with pytest.raises(NotImplementedError, match="schedule='shift' does not run on sliding windows"):
        backward_schedule_used(q, q, window_size=(128, 0), schedule="shift")
