"""flash_attn_dash under transformers on an sm90 GPU: a tiny bf16 Llama's forward + backward gives the same bits
twice with deterministic=True (dense, padded and packed batches), and its logits are as close to an fp32 reference
as sdpa's are."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from flash_attn_dash.integrations import hf  # noqa: E402

pytestmark = pytest.mark.gpu

SEQ = 384
CONFIG = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, initializer_range=0.1)


def _model(impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**CONFIG), attn_implementation=impl, dtype=torch.bfloat16)
    return model.cuda()


def _case(case: str) -> dict[str, Any]:
    if case == "padding":
        mask = torch.ones(2, SEQ, dtype=torch.long, device="cuda")
        mask[0, :100] = 0
        mask[1, SEQ - 37:] = 0
        return {"attention_mask": mask}
    if case == "packed":
        return {"position_ids": torch.cat([torch.arange(n) for n in (200, 57, 127)]).view(1, SEQ).expand(2, SEQ)
                .cuda()}
    return {}


def _step(model: torch.nn.Module, embeds: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every gradient (weights and input embeddings) of one forward + backward. inputs_embeds keeps the
    embedding lookup's scatter-add backward, not deterministic on CUDA, out of the comparison."""
    model.zero_grad(set_to_none=True)
    embeds = embeds.detach().requires_grad_()
    logits = model(inputs_embeds=embeds, use_cache=False, **kwargs).logits
    logits.float().square().mean().backward()
    return logits.detach(), [embeds.grad] + [p.grad for p in model.parameters()]


def _embeds() -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(1)
    return torch.randn(2, SEQ, CONFIG["hidden_size"], device="cuda", dtype=torch.bfloat16, generator=generator)


@pytest.mark.parametrize("case", ["dense", "padding", "packed"])
def test_forward_backward_bitwise_reproducible(case):
    model = _model(hf.register("dash_attention_deterministic", deterministic=True))
    embeds, kwargs = _embeds(), _case(case)
    logits_a, grads_a = _step(model, embeds, **kwargs)
    logits_b, grads_b = _step(model, embeds, **kwargs)
    assert torch.equal(logits_a, logits_b)
    assert len(grads_a) == len(grads_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))
    assert all(g.abs().sum() > 0 for g in grads_a)


@pytest.mark.parametrize("case", ["dense", "padding", "packed"])
def test_logits_as_close_to_fp32_as_sdpa(case):
    ours, sdpa = _model(hf.register()), _model("sdpa")
    reference = copy.deepcopy(sdpa).float()
    embeds, kwargs = _embeds(), _case(case)
    keep = kwargs["attention_mask"].bool() if case == "padding" else slice(None)
    with torch.no_grad():
        want = reference(inputs_embeds=embeds.float(), use_cache=False, **kwargs).logits[keep]
        ours_err = (ours(inputs_embeds=embeds, use_cache=False, **kwargs).logits[keep].float() - want).abs().max()
        sdpa_err = (sdpa(inputs_embeds=embeds, use_cache=False, **kwargs).logits[keep].float() - want).abs().max()
    assert ours_err <= 2 * sdpa_err + 1e-3, (ours_err, sdpa_err)
