"""Which backward call of the HF Mistral (window 64, padded batch) step gives other bits in the step after the
fp32-error check: every ops.bwd_into call's launch, tensor layouts and input/output checksums, step A beside B."""
import sys

import torch

sys.path.insert(0, "tests")
from flash_attn_dash import features, ops  # noqa: E402

features.SLIDING_WINDOW_KERNELS_VALIDATED = True
import test_integration_hf_gpu as t  # noqa: E402
from transformers import MistralConfig  # noqa: E402
from flash_attn_dash.integrations import hf  # noqa: E402

calls = []
inner = ops.bwd_into


def digest(x):
    return (tuple(x.shape), tuple(x.stride()), x.data_ptr() % 4096, x.float().double().sum().item(),
            x.view(torch.int16 if x.element_size() == 2 else torch.int32).long().sum().item())


def recording(dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs):
    ins = [digest(x) for x in (dout, q, k, v, out, lse)]
    launch = inner(dout, q, k, v, out, lse, dq, dk, dv, *args, **kwargs)
    torch.cuda.synchronize()
    calls.append(dict(args=args, kwargs=kwargs, launch=launch, ins=ins, outs=[digest(x) for x in (dq, dk, dv)]))
    return launch


ops.bwd_into = recording
import transformers  # noqa: E402
import flash_attn_dash.integrations.hf as H  # noqa: E402

counts = {"attention_forward": 0, "_padded": 0, "forward_into": 0, "backward_into": 0}


def counting(module, name):
    inner_fn = getattr(module, name)

    def wrapper(*a, **k):
        counts[name] += 1
        return inner_fn(*a, **k)
    setattr(module, name, wrapper)


counting(H, "attention_forward")
counting(H, "_padded")
counting(ops, "forward_into")
counting(ops, "backward_into")
print("transformers", transformers.__version__)
cfg = MistralConfig(**t.CONFIG, sliding_window=64)
m = t._model(hf.register("dash_attention_deterministic", deterministic=True), cfg)
print("errors", t._errors_vs_fp32(m, t._model("sdpa", cfg), "padding"))
e, kw = t._embeds(), t._case("padding")
steps = []
for _ in range(3):
    calls.clear()
    t._step(m, e, **kw)
    steps.append(list(calls))
print(counts)
for s in (1, 2):
    print(f"step 0 vs {s}: {len(steps[0])} / {len(steps[s])} calls")
    for i, (a, b) in enumerate(zip(steps[0], steps[s])):
        names = ["dout", "q", "k", "v", "out", "lse"]
        diff_in = [n for n, x, y in zip(names, a["ins"], b["ins"]) if x != y]
        diff_out = [n for n, x, y in zip(["dq", "dk", "dv"], a["outs"], b["outs"]) if x != y]
        same = a["args"] == b["args"] and a["kwargs"] == b["kwargs"] and a["launch"] == b["launch"]
        if diff_in or diff_out or not same or s == 1 and i < 2:
            print(f"  call {i}: launch {a['launch']} same-args {same} inputs differ {diff_in} outputs differ {diff_out}")
            for n, x, y in zip(names, a["ins"], b["ins"]):
                if x != y:
                    print("    ", n, x, y)
            if not same:
                print("    ", a["args"], a["kwargs"], b["launch"])
