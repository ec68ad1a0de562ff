"""flash_attn_dash under transformers on an sm90 GPU: a tiny bf16 Llama's forward + backward gives the same bits
twice with deterministic=True (dense, padded and packed batches), and its logits are as close to an fp32 reference
as sdpa's are; a Mistral sliding window runs on the kernels as close to fp32 as sdpa's, and gpt-oss's sinks as close
as eager's, and Gemma2's softcap (global and local layers) as close as eager's;
a Mistral window that masks no key runs the plain kernels, with the bits of the model without a window."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", minversion="5.0")

from transformers import AutoModelForCausalLM, Gemma2Config, GptOssConfig, LlamaConfig, MistralConfig  # noqa: E402

from flash_attn_dash.integrations import hf  # noqa: E402

pytestmark = pytest.mark.gpu

SEQ = 384
CONFIG = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=1024, initializer_range=0.1)


def _model(impl: str, config: Any = None) -> torch.nn.Module:
    """A model of its own copy of ``config``: from_config writes the implementation into the config it is given, and
    every layer reads it at each call, so two models built from one config would both run the last one's."""
    torch.manual_seed(0)
    config = LlamaConfig(**CONFIG) if config is None else copy.deepcopy(config)
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.bfloat16).cuda()


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
    embedding lookup's scatter-add backward, not deterministic on CUDA, out of the comparison (so the embedding
    table, unused, has no gradient and is left out)."""
    model.zero_grad(set_to_none=True)
    embeds = embeds.detach().requires_grad_()
    logits = model(inputs_embeds=embeds, use_cache=False, **kwargs).logits
    logits.float().square().mean().backward()
    return logits.detach(), [embeds.grad] + [p.grad for name, p in model.named_parameters() if "embed_tokens" not in name]


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


def _errors_vs_fp32(ours: torch.nn.Module, sdpa: torch.nn.Module, case: str) -> tuple[float, float]:
    """Max |logits - fp32 sdpa logits| of ``ours`` and of bf16 ``sdpa`` (same weights) on the case's batch."""
    assert ours.config._attn_implementation != sdpa.config._attn_implementation
    reference = copy.deepcopy(sdpa).float()
    embeds, kwargs = _embeds(), _case(case)
    keep = kwargs["attention_mask"].bool() if case == "padding" else slice(None)
    with torch.no_grad():
        want = reference(inputs_embeds=embeds.float(), use_cache=False, **kwargs).logits[keep]
        ours_err = (ours(inputs_embeds=embeds, use_cache=False, **kwargs).logits[keep].float() - want).abs().max()
        sdpa_err = (sdpa(inputs_embeds=embeds, use_cache=False, **kwargs).logits[keep].float() - want).abs().max()
    return ours_err.item(), sdpa_err.item()


@pytest.mark.parametrize("case", ["dense", "padding", "packed"])
def test_logits_as_close_to_fp32_as_sdpa(case):
    ours_err, sdpa_err = _errors_vs_fp32(_model(hf.register()), _model("sdpa"), case)
    assert ours_err <= 2 * sdpa_err + 1e-3, (ours_err, sdpa_err)


# Longer than every sequence of the padded and packed batches (at most 347 and 200 tokens) but shorter than SEQ: it
# reaches flash_attn_dash as window_size=(359, 359), which masks keys only in the dense batch.
WINDOW = 360


@pytest.mark.parametrize("case", ["padding", "packed"])
def test_a_window_that_masks_no_key_runs_the_plain_kernels(case):
    impl = hf.register("dash_attention_deterministic", deterministic=True)
    windowed = _model(impl, MistralConfig(**CONFIG, sliding_window=WINDOW))
    plain = _model(impl, MistralConfig(**CONFIG, sliding_window=None))
    embeds, kwargs = _embeds(), _case(case)
    logits_w, grads_w = _step(windowed, embeds, **kwargs)
    logits_p, grads_p = _step(plain, embeds, **kwargs)
    assert torch.equal(logits_w, logits_p)
    assert all(torch.equal(a, b) for a, b in zip(grads_w, grads_p))


@pytest.mark.parametrize("case", ["dense", "padding", "packed"])
def test_a_mistral_sliding_window_runs_as_close_to_fp32_as_sdpa(case):
    """A window of 64 tokens (masking keys in every batch) runs on the kernels: logits as close to an fp32 sdpa
    model's as bf16 sdpa's, and the deterministic step gives the same bits twice."""
    config = MistralConfig(**CONFIG, sliding_window=64)
    ours = _model(hf.register("dash_attention_deterministic", deterministic=True), config)
    ours_err, sdpa_err = _errors_vs_fp32(ours, _model("sdpa", config), case)
    assert ours_err <= 2 * sdpa_err + 1e-3, (ours_err, sdpa_err)
    embeds, kwargs = _embeds(), _case(case)
    logits_a, grads_a = _step(ours, embeds, **kwargs)
    logits_b, grads_b = _step(ours, embeds, **kwargs)
    assert torch.equal(logits_a, logits_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


def _gemma2_softcap(sliding_window: int = 2 * SEQ) -> Gemma2Config:
    # The default window is longer than every batch (it masks nothing): the softcap runs on the plain masks' kernels.
    return Gemma2Config(**CONFIG, attn_logit_softcapping=50.0, query_pre_attn_scalar=64, sliding_window=sliding_window)


def _assert_close_to_eager_and_repeats(config: Gemma2Config, case: str) -> None:
    """Logits as close to an fp32 eager model's as bf16 eager's, and the deterministic step's bits repeat."""
    ours_err, eager_err = _errors_vs_fp32(_model(hf.register(), config), _model("eager", config), case)
    assert ours_err <= 2 * eager_err + 1e-3, (ours_err, eager_err)
    model = _model(hf.register("dash_attention_deterministic", deterministic=True), config)
    embeds, kwargs = _embeds(), _case(case)
    logits_a, grads_a = _step(model, embeds, **kwargs)
    logits_b, grads_b = _step(model, embeds, **kwargs)
    assert torch.equal(logits_a, logits_b) and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


@pytest.mark.parametrize("case", ["dense", "padding"])
def test_gemma2_softcap_runs_as_close_to_fp32_as_eager(case):
    """Gemma 2's attention softcap (50) on the softcap kernels."""
    _assert_close_to_eager_and_repeats(_gemma2_softcap(), case)


@pytest.mark.parametrize("case", ["dense", "padding"])
def test_gemma2_local_layers_run_softcap_windows_as_close_to_fp32_as_eager(case):
    """Gemma 2's local layers (a 64-token window with softcap 50, GQA 8/2: the folded softcap window kernels) beside
    its global ones."""
    _assert_close_to_eager_and_repeats(_gemma2_softcap(sliding_window=64), case)


@pytest.mark.parametrize("case", ["dense", "padding"])
def test_gpt_oss_sinks_run_as_close_to_fp32_as_eager(case):
    """gpt-oss's sinks (``s_aux``) run on the kernels (a window longer than the batch, so the plain masks): logits
    and the sinks' gradients as close to an fp32 eager model's as bf16 eager's (every expert routed, so routing
    cannot flip between the models). The loss leaves padded positions out, as a training loss does: there eager's
    right-padded query rows attend to the real keys while the flash path drops them (their output is 0)."""
    config = GptOssConfig(**CONFIG, num_local_experts=4, num_experts_per_tok=4, sliding_window=2 * SEQ)
    ours = _model(hf.register(), config)
    eager = _model("eager", config)
    ours_err, eager_err = _errors_vs_fp32(ours, eager, case)
    assert ours_err <= 2 * eager_err + 1e-3, (ours_err, eager_err)
    reference = copy.deepcopy(eager).float()
    embeds, kwargs = _embeds(), _case(case)
    keep = kwargs["attention_mask"].bool() if case == "padding" else slice(None)
    sinks = []
    for model, x in ((reference, embeds.float()), (eager, embeds), (ours, embeds)):
        model.zero_grad(set_to_none=True)
        model(inputs_embeds=x, use_cache=False, **kwargs).logits[keep].float().square().mean().backward()
        sinks.append(torch.stack([layer.self_attn.sinks.grad.float() for layer in model.model.layers]))
    want, eager_grad, ours_grad = sinks
    assert ours_grad.abs().max() > 0
    err, err_eager = (ours_grad - want).abs().max().item(), (eager_grad - want).abs().max().item()
    assert err <= 2 * err_eager + 1e-3 * want.abs().max().item(), (err, err_eager)
