"""Where a deterministic HF Mistral step with a 64-token window and a padded batch loses bitwise reproducibility:
the model's gradients by name, the same with torch's deterministic algorithms, and the attention calls alone."""
import sys

import torch

sys.path.insert(0, "tests")
from flash_attn_dash import features, flash_attn_func, flash_attn_varlen_func  # noqa: E402

features.SLIDING_WINDOW_KERNELS_VALIDATED = True
import test_integration_hf_gpu as t  # noqa: E402
from transformers import MistralConfig  # noqa: E402
from flash_attn_dash.integrations import hf  # noqa: E402


def poison(value=float("nan")):
    """Hand the caching allocator's free blocks back filled with ``value`` (reads of memory no one wrote show)."""
    blocks = [torch.full((int(mb * 2**18),), value, device="cuda") for mb in (0.004, 0.06, 0.5, 1, 2, 8, 32)
              for _ in range(6)]
    del blocks


def model_steps(tag, window=64, like_test=False, poisoned=False, case="padding"):
    cfg = MistralConfig(**t.CONFIG, sliding_window=window)
    m = t._model(hf.register("dash_attention_deterministic", deterministic=True), cfg)
    if like_test:
        print("  errors vs fp32", t._errors_vs_fp32(m, t._model("sdpa", cfg), case))
    names = ["embeds"] + [n for n, p in m.named_parameters() if "embed_tokens" not in n]
    e, kw = t._embeds(), t._case(case)
    if poisoned:
        poison()
    la, ga = t._step(m, e, **kw)
    bad = {}
    for i in range(4):
        if poisoned:
            poison(float("nan") if i % 2 else 3.0e4)
        lb, gb = t._step(m, e, **kw)
        for n, a, b in zip(names, ga, gb):
            if not torch.equal(a, b):
                bad[n] = max(bad.get(n, 0.0), (a.float() - b.float()).abs().max().item())
    nans = [n for n, g in zip(names, ga) if not torch.isfinite(g).all()]
    print(tag, "logits equal", torch.equal(la, lb), "non-finite grads", nans[:4], "differing grads:", len(bad),
          sorted(bad.items(), key=lambda x: -x[1])[:6])


model_steps("default")
model_steps("like-test", like_test=True)
model_steps("poisoned", poisoned=True)
model_steps("poisoned-nowindow", window=None, poisoned=True)
model_steps("poisoned-packed", poisoned=True, case="packed")

for lens in ([284, 347], [200, 57, 127]):
    torch.manual_seed(0)
    n = sum(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(n, 8, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(n, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(n, 2, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(n, 8, 64, device="cuda", dtype=torch.bfloat16)

    def run_varlen():
        q.grad = k.grad = v.grad = None
        o = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, window_size=(63, 63),
                                   deterministic=True)
        o.backward(do)
        return [o.detach().clone(), q.grad.clone(), k.grad.clone(), v.grad.clone()]

    def run_dense(s, e):
        qs, ks, vs = (x.detach()[s:e][None].clone().requires_grad_() for x in (q, k, v))
        o = flash_attn_func(qs, ks, vs, causal=True, window_size=(63, 63), deterministic=True)
        o.backward(do[s:e][None])
        return [o.detach(), qs.grad, ks.grad, vs.grad]

    first = run_varlen()
    diffs = [0, 0, 0, 0]
    for r in range(30):
        poison(float("nan") if r % 2 else 3.0e4)
        for i, (a, b) in enumerate(zip(first, run_varlen())):
            diffs[i] += not torch.equal(a, b)
    print("poisoned varlen", lens, "runs differing (out, dq, dk, dv) of 30:", diffs)
    s = 0
    for L in lens:
        f = run_dense(s, s + L)
        d = [0, 0, 0, 0]
        for _ in range(30):
            for i, (a, b) in enumerate(zip(f, run_dense(s, s + L))):
                d[i] += not torch.equal(a, b)
        print("  dense", L, "differing of 30:", d)
        s += L
