"""flash_attn_dash as a transformers attn_implementation, on the CPU reference path.

Tiny random-init models built from configs (no downloads), in fp64, against the same weights under transformers'
sdpa (eager for Gemma2 and gpt-oss, which have no sdpa path): logits and gradients, with and without padding, packed
position_ids and explicit cu_seq_lens, also with sliding windows that mask keys, Gemma2's softcap and gpt-oss's
sinks. A spy on the module's references to flash_attn_func / flash_attn_varlen_func shows which path ran and with
which settings and features.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

transformers = pytest.importorskip("transformers", minversion="5.0")

from transformers import AttentionInterface, AutoModelForCausalLM  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402

from flash_attn_dash.integrations import hf  # noqa: E402

NAME = hf.register()
SEQ = 12
# Large enough weights that attention is far from uniform, so a wrong mask or scale moves the logits.
COMMON = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, initializer_range=0.2, max_position_embeddings=128, pad_token_id=0)


# Shorter than the test sequences and than the packed documents of 5 and 6 tokens: the window masks keys.
WINDOW = 4
# One sliding-window layer and one full one (Gemma2 and gpt-oss alternate them by default; Mistral's are all sliding).
ALTERNATING = ["sliding_attention", "full_attention"]


def _configs() -> dict[str, tuple[Any, str]]:
    """Each model family's tiny config and the transformers implementation it is compared with. Windows of
    ``2 * SEQ`` cover the test sequences (they mask nothing), ``WINDOW`` masks keys; Gemma2/3 scale by
    query_pre_attn_scalar, not head_dim; gpt-oss's experts run eagerly (its grouped-mm experts take no fp64)."""
    t = transformers
    return {
        "llama": (t.LlamaConfig(**COMMON), "sdpa"),
        "qwen2": (t.Qwen2Config(**COMMON), "sdpa"),
        "mistral": (t.MistralConfig(**COMMON, sliding_window=None), "sdpa"),
        "mistral-window": (t.MistralConfig(**COMMON, sliding_window=WINDOW), "sdpa"),
        "gemma": (t.GemmaConfig(**COMMON), "sdpa"),
        "gemma2": (t.Gemma2Config(**COMMON, attn_logit_softcapping=None, sliding_window=2 * SEQ,
                                  query_pre_attn_scalar=32), "eager"),
        "gemma2-window": (t.Gemma2Config(**COMMON, attn_logit_softcapping=None, sliding_window=WINDOW,
                                         layer_types=ALTERNATING, query_pre_attn_scalar=32), "eager"),
        "gemma2-softcap": (t.Gemma2Config(**COMMON, attn_logit_softcapping=50.0, sliding_window=2 * SEQ,
                                          query_pre_attn_scalar=32), "eager"),
        "gemma3": (t.Gemma3TextConfig(**COMMON, sliding_window=2 * SEQ, query_pre_attn_scalar=32), "sdpa"),
        "gemma3-window": (t.Gemma3TextConfig(**COMMON, sliding_window=WINDOW, layer_types=ALTERNATING,
                                             query_pre_attn_scalar=32), "sdpa"),
        "gpt-oss": (t.GptOssConfig(**{**COMMON, "intermediate_size": 64}, num_local_experts=4, num_experts_per_tok=2,
                                   sliding_window=WINDOW, layer_types=ALTERNATING, experts_implementation="eager"),
                    "eager"),
    }


MODELS = list(_configs())
# eager runs its softmax in fp32 even for fp64 models.
ATOL = {"sdpa": 1e-10, "eager": 2e-5}


def _pair(kind: str, **overrides: Any) -> tuple[torch.nn.Module, torch.nn.Module, str]:
    """(reference model, the same weights on flash_attn_dash, reference implementation name)."""
    config, impl = _configs()[kind]
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(config, attn_implementation=impl, dtype=torch.float64)
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(NAME)
    assert ours.config._attn_implementation == NAME and ref.config._attn_implementation == impl
    return ref, ours, impl


@dataclass
class Call:
    path: str  # "dense" (flash_attn_func) or "varlen" (flash_attn_varlen_func)
    args: tuple
    kwargs: dict


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    seen: list[Call] = []
    for path, attr in (("dense", "flash_attn_func"), ("varlen", "flash_attn_varlen_func")):
        real = getattr(hf, attr)

        def spy(*args, _real=real, _path=path, **kwargs):
            seen.append(Call(_path, args, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(hf, attr, spy)
    return seen


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hf.ENV_DETERMINISTIC, raising=False)
    monkeypatch.delenv(hf.ENV_SCHEDULE, raising=False)


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made in a test are dropped after it."""
    monkeypatch.setattr(AttentionInterface, "_global_mapping", dict(AttentionInterface._global_mapping))
    monkeypatch.setattr(AttentionMaskInterface, "_global_mapping", dict(AttentionMaskInterface._global_mapping))


def _ids(batch: int = 2, seqlen: int = SEQ, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, COMMON["vocab_size"], (batch, seqlen), generator=torch.Generator().manual_seed(seed))


def _padding(side: str) -> torch.Tensor:
    """Rows with 3 and 0 padded tokens (left) or 0 and 3 (right): unequal lengths, one row unpadded. Fewer than
    WINDOW on the right, so every padded query sees a real key: eager's fp32 softmax of an fp64 model turns a row of
    masked keys into NaN (Gemma2), which its gradients would carry."""
    mask = torch.ones(2, SEQ, dtype=torch.long)
    if side == "left":
        mask[0, :3] = 0
    else:
        mask[1, SEQ - 3:] = 0
    return mask


# Documents of 3, 2, 5, 2 tokens; two of 6, the second resuming at position 3 (a sequence starts wherever a position
# is not the previous one + 1, not only at 0).
PACKED = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0, 1],
                       [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8]])


def _reference_packing(model: torch.nn.Module, position_ids: torch.Tensor) -> dict[str, Any]:
    """The kwargs that run packed ``position_ids`` on a reference model. gpt-oss builds its masks without
    position_ids, so its eager path runs the documents as one sequence (its flash path, like ours, splits them); it
    gets the masks the other models build, as eager's additive masks per layer type: causal within each document,
    and within its sliding window on the sliding layers."""
    if model.config.model_type != "gpt_oss":
        return {"position_ids": position_ids}
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    document = starts.cumsum(dim=1)
    pos, key = torch.arange(position_ids.shape[1])[:, None], torch.arange(position_ids.shape[1])[None, :]
    full = (document[:, :, None] == document[:, None, :]) & (key <= pos)
    sliding = full & (key > pos - model.config.sliding_window)

    def additive(seen: torch.Tensor) -> torch.Tensor:
        return torch.zeros(seen.shape, dtype=torch.float64).masked_fill(~seen, torch.finfo(torch.float64).min)[:, None]

    return {"position_ids": position_ids,
            "attention_mask": {"full_attention": additive(full), "sliding_attention": additive(sliding)}}


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    # use_cache=False: transformers reads packed position_ids into its masks only without a cache.
    return model(ids, use_cache=False, **kwargs).logits


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", MODELS)
def test_logits_match_without_padding(kind, calls):
    ref, ours, impl = _pair(kind)
    ids = _ids()
    torch.testing.assert_close(_logits(ours, ids), _logits(ref, ids), atol=ATOL[impl], rtol=0)
    assert [c.path for c in calls] == ["dense"] * COMMON["num_hidden_layers"]
    q, k = calls[0].args[0], calls[0].args[1]
    # GQA runs as GQA: 4 query heads against the 2 key/value heads, not repeated.
    assert q.shape == (2, SEQ, 4, 16) and k.shape == (2, SEQ, 2, 16)
    assert calls[0].kwargs["causal"] is True


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", [k for k in MODELS if _configs()[k][1] == "sdpa"])
def test_logits_match_sdpa_with_padding(kind, side, calls):
    ref, ours, impl = _pair(kind)
    ids, mask = _ids(), _padding(side)
    real = mask.bool()
    torch.testing.assert_close(_logits(ours, ids, attention_mask=mask)[real],
                               _logits(ref, ids, attention_mask=mask)[real], atol=ATOL[impl], rtol=0)
    assert {c.path for c in calls} == {"varlen"}
    cu_q = calls[0].args[3]
    assert cu_q.tolist() == [0, *mask.sum(1).cumsum(0).tolist()]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("kind", MODELS)
def test_padded_rows_match_each_sequence_run_alone(kind, side):
    """The reference model on each unpadded sequence alone (same positions): also covers Gemma2, whose eager
    reference turns left-padded batches into NaN."""
    ref, ours, impl = _pair(kind)
    ids, mask = _ids(), _padding(side)
    positions = torch.arange(SEQ).expand(2, SEQ)
    padded = _logits(ours, ids, attention_mask=mask, position_ids=positions)
    for row in range(2):
        keep = mask[row].bool()
        alone = _logits(ref, ids[row:row + 1, keep], position_ids=positions[row:row + 1, keep])
        torch.testing.assert_close(padded[row, keep], alone[0], atol=ATOL[impl], rtol=0)


@pytest.mark.parametrize("kind", MODELS)
def test_packed_position_ids_match_reference_and_separate_documents(kind, calls):
    ref, ours, impl = _pair(kind)
    ids = _ids()
    packed = _logits(ours, ids, position_ids=PACKED)
    torch.testing.assert_close(packed, _logits(ref, ids, **_reference_packing(ref, PACKED)), atol=ATOL[impl],
                               rtol=0)
    assert [c.path for c in calls] == ["varlen"] * COMMON["num_hidden_layers"]
    # One varlen call over both rows: documents never straddle a row.
    assert calls[0].args[3].tolist() == [0, 3, 5, 10, 12, 18, 24]
    assert calls[0].args[5] == 6
    calls.clear()
    for start, end in ((0, 3), (3, 5), (5, 10), (10, 12)):
        torch.testing.assert_close(packed[0, start:end], _logits(ref, ids[:1, start:end])[0], atol=ATOL[impl],
                                   rtol=0)


@pytest.mark.parametrize("kind", MODELS)
def test_explicit_cu_seq_lens_match_packed_position_ids(kind, calls):
    """The kwargs DataCollatorWithFlattening(return_flash_attn_kwargs=True) makes: one flattened row, int64
    offsets allowed, max lengths as ints, as 0-d tensors, or left out."""
    ref, ours, impl = _pair(kind)
    ids, positions = _ids().view(1, -1), PACKED.reshape(1, -1)
    expected = _logits(ref, ids, **_reference_packing(ref, positions))
    cu = torch.tensor([0, 3, 5, 10, 12, 18, 24])
    for lengths in ({"max_length_q": 6, "max_length_k": 6},
                    {"max_length_q": torch.tensor(6), "max_length_k": torch.tensor(6)}, {}):
        got = _logits(ours, ids, position_ids=positions, cu_seq_lens_q=cu, cu_seq_lens_k=cu.to(torch.int32),
                      **lengths)
        torch.testing.assert_close(got, expected, atol=ATOL[impl], rtol=0)
        assert calls[-1].path == "varlen" and calls[-1].args[3].dtype == torch.int32
        assert calls[-1].args[5:7] == (6, 6)


def test_batches_of_data_collator_with_flattening_run_packed(calls):
    ref, ours, impl = _pair("qwen2")
    features = [{"input_ids": _ids(1, n, seed=n)[0].tolist()} for n in (3, 5, 4)]
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_tensors="pt")
    batch = collate(features)
    assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"} <= batch.keys()
    got = ours(**batch, use_cache=False)
    want = ref(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"],
               use_cache=False)
    torch.testing.assert_close(got.logits, want.logits, atol=ATOL[impl], rtol=0)
    torch.testing.assert_close(got.loss, want.loss, atol=ATOL[impl], rtol=0)
    assert calls[0].path == "varlen" and calls[0].args[3].tolist() == [0, 3, 8, 12]


@pytest.mark.parametrize("case", ["dense", "padding", "packed"])
@pytest.mark.parametrize("kind", MODELS)
def test_gradients_flow_to_the_weights_and_match(kind, case):
    ref, ours, impl = _pair(kind)
    ids = _ids()
    ours_kwargs: dict[str, Any] = {}
    ref_kwargs: dict[str, Any] = {}
    labels = ids.clone()
    if case == "padding":
        mask = _padding("right")
        ours_kwargs = ref_kwargs = {"attention_mask": mask}
        labels[mask == 0] = -100
    elif case == "packed":
        ours_kwargs, ref_kwargs = {"position_ids": PACKED}, _reference_packing(ref, PACKED)
    ref(ids, labels=labels, use_cache=False, **ref_kwargs).loss.backward()
    ours(ids, labels=labels, use_cache=False, **ours_kwargs).loss.backward()
    got, want = _grads(ours), _grads(ref)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, atol=ATOL[impl] * 10, rtol=1e-6, msg=name)
    for layer in range(COMMON["num_hidden_layers"]):
        for proj in ("q_proj", "k_proj", "v_proj"):
            assert got[f"model.layers.{layer}.self_attn.{proj}.weight"].abs().sum() > 0
        if kind == "gpt-oss":  # the sinks' gradient comes back through learnable_sink
            assert got[f"model.layers.{layer}.self_attn.sinks"].abs().sum() > 0


@pytest.mark.parametrize("window", [WINDOW, 4 * SEQ])
def test_bidirectional_gemma3_runs_non_causal(window, calls):
    """Gemma3's use_bidirectional_attention: non-causal layers, whose mask transformers builds with an overlay; the
    overlay is checked to be the full pattern with key padding, on the sliding layer within its window (as many
    tokens ahead as behind)."""
    ref, ours, impl = _pair("gemma3-window", use_bidirectional_attention=True, sliding_window=window)
    assert not ours.model.layers[0].self_attn.is_causal
    ids, mask = _ids(), _padding("left")
    torch.testing.assert_close(_logits(ours, ids), _logits(ref, ids), atol=ATOL[impl], rtol=0)
    real = mask.bool()
    torch.testing.assert_close(_logits(ours, ids, attention_mask=mask)[real],
                               _logits(ref, ids, attention_mask=mask)[real], atol=ATOL[impl], rtol=0)
    assert calls and all(c.kwargs["causal"] is False for c in calls)
    sliding = (window - 1, window - 1) if window < SEQ else (-1, -1)
    assert [c.kwargs["window_size"] for c in calls[-2:]] == [sliding, (-1, -1)]


@pytest.mark.parametrize("kind", ["gemma2", "gemma3"])
def test_scaling_is_the_models(kind, calls):
    _, ours, _ = _pair(kind)
    ours(_ids())
    assert calls[0].kwargs["softmax_scale"] == pytest.approx(32 ** -0.5)  # not head_dim ** -0.5 = 0.25


def test_from_config_with_the_name_equals_set_attn_implementation():
    config, _ = _configs()["llama"]
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(config, attn_implementation=NAME, dtype=torch.float64)
    assert built.config._attn_implementation == NAME
    ref, ours, _ = _pair("llama")
    built.load_state_dict(ref.state_dict())
    ids = _ids()
    torch.testing.assert_close(_logits(built, ids, attention_mask=_padding("left")),
                               _logits(ours, ids, attention_mask=_padding("left")), atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "mistral-window"])
def test_left_padded_greedy_generation_matches_sdpa(kind):
    """The cache path: a padded prefill, then one query per step against the cached keys (for Mistral the sliding
    cache's last WINDOW - 1 keys and the query, after a prefill the window masks)."""
    ref, ours, _ = _pair(kind)
    ids, mask = _ids(), _padding("left")
    ids[mask == 0] = COMMON["pad_token_id"]
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(ours.generate(ids, **kwargs), ref.generate(ids, **kwargs))


# Settings: deterministic and schedule.

def _settings_seen(model: torch.nn.Module, calls: list[Call], **kwargs: Any) -> tuple[bool | None, str]:
    calls.clear()
    model(_ids(), **kwargs)
    seen = {(c.kwargs["deterministic"], c.kwargs["schedule"]) for c in calls}
    assert len(seen) == 1, seen
    return seen.pop()


def test_default_settings_follow_torch_switch(calls):
    _, ours, _ = _pair("llama")
    # None reaches flash_attn_func, which reads torch.are_deterministic_algorithms_enabled() at call time.
    assert _settings_seen(ours, calls) == (None, "auto")


def test_settings_levels_first_set_wins(calls, monkeypatch, scratch_registry):
    _, ours, _ = _pair("llama")
    monkeypatch.setenv(hf.ENV_DETERMINISTIC, "1")
    monkeypatch.setenv(hf.ENV_SCHEDULE, "ascending")
    assert _settings_seen(ours, calls) == (True, "ascending")
    ours.set_attn_implementation(hf.register("dash_attention_test", deterministic=False, schedule="descending"))
    assert _settings_seen(ours, calls) == (False, "descending")
    setattr(ours.config, hf.CONFIG_DETERMINISTIC, True)
    setattr(ours.config, hf.CONFIG_SCHEDULE, "symmetric_shift")
    assert _settings_seen(ours, calls) == (True, "symmetric_shift")
    assert _settings_seen(ours, calls, deterministic=False, schedule="ascending") == (False, "ascending")
    # Levels decide each setting on its own: an unset call schedule falls through to the config's.
    assert _settings_seen(ours, calls, deterministic=False) == (False, "symmetric_shift")


def test_settings_reach_the_varlen_path_and_the_backward(calls, monkeypatch):
    _, ours, _ = _pair("llama")
    monkeypatch.setenv(hf.ENV_DETERMINISTIC, "true")
    monkeypatch.setenv(hf.ENV_SCHEDULE, "descending")
    ours(_ids(), attention_mask=_padding("left"), labels=_ids(), use_cache=False).loss.backward()
    assert calls and all(c.path == "varlen" and (c.kwargs["deterministic"], c.kwargs["schedule"]) ==
                         (True, "descending") for c in calls)


def test_config_constructor_kwargs_set_the_settings(calls):
    config = transformers.LlamaConfig(**COMMON, **{hf.CONFIG_DETERMINISTIC: True, hf.CONFIG_SCHEDULE: "ascending"})
    model = AutoModelForCausalLM.from_config(config, attn_implementation=NAME, dtype=torch.float64)
    assert _settings_seen(model, calls) == (True, "ascending")


@pytest.mark.parametrize("raw", ["yes", "2", "True!"])
def test_env_deterministic_is_validated(raw, monkeypatch):
    _, ours, _ = _pair("llama")
    monkeypatch.setenv(hf.ENV_DETERMINISTIC, raw)
    with pytest.raises(ValueError, match=f"{hf.ENV_DETERMINISTIC} must be 1, 0, true or false.*{raw!r}"):
        hf.register()
    with pytest.raises(ValueError, match=hf.ENV_DETERMINISTIC):
        ours(_ids())


@pytest.mark.parametrize("raw, expected", [("1", True), ("TRUE", True), ("0", False), ("false", False), ("", None),
                                           ("  ", None)])
def test_env_deterministic_values(raw, expected, monkeypatch):
    monkeypatch.setenv(hf.ENV_DETERMINISTIC, raw)
    assert hf.env_settings().deterministic is expected


def test_env_schedule_is_validated(monkeypatch):
    _, ours, _ = _pair("llama")
    monkeypatch.setenv(hf.ENV_SCHEDULE, "fastest")
    with pytest.raises(ValueError, match=f"{hf.ENV_SCHEDULE} must be one of 'auto'.*'fastest'"):
        hf.register()
    # A schedule of the other mask is caught at the call, under the variable's name.
    monkeypatch.setenv(hf.ENV_SCHEDULE, "shift")
    with pytest.raises(ValueError, match=f"{hf.ENV_SCHEDULE}='shift': schedule='shift' is defined for full masks"):
        ours(_ids())


def test_config_settings_are_validated():
    _, ours, _ = _pair("llama")
    setattr(ours.config, hf.CONFIG_DETERMINISTIC, "yes")
    with pytest.raises(TypeError, match=f"config.{hf.CONFIG_DETERMINISTIC} must be a bool"):
        ours(_ids())
    setattr(ours.config, hf.CONFIG_DETERMINISTIC, True)
    setattr(ours.config, hf.CONFIG_SCHEDULE, "reverse")
    with pytest.raises(ValueError, match=f"config.{hf.CONFIG_SCHEDULE} must be one of"):
        ours(_ids())


def test_call_settings_are_validated():
    _, ours, _ = _pair("llama")
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        ours(_ids(), deterministic=1)
    with pytest.raises(ValueError, match="schedule='shift': schedule='shift' is defined for full masks"):
        ours(_ids(), schedule="shift")


# register().

def test_register_adds_both_interfaces(scratch_registry):
    assert hf.register("dash_attention_x") == "dash_attention_x"
    assert "dash_attention_x" in AttentionInterface._global_mapping
    assert AttentionMaskInterface._global_mapping["dash_attention_x"] is hf.padding_mask


@pytest.mark.parametrize("kwargs, error, match", [
    ({"name": "flash_attn_dash"}, ValueError, "name must not contain 'flash'"),
    ({"name": ""}, TypeError, "name must be a non-empty str"),
    ({"name": 3}, TypeError, "name must be a non-empty str"),
    ({"deterministic": "true"}, TypeError, "deterministic must be a bool"),
    ({"schedule": "Auto"}, ValueError, "schedule must be one of 'auto'"),
])
def test_register_validates_its_arguments(kwargs, error, match, scratch_registry):
    with pytest.raises(error, match=match):
        hf.register(**kwargs)


def test_transformers_refuses_custom_names_with_flash(scratch_registry):
    """Why register() rejects them: transformers sends such names to its flash-attention loader."""
    AttentionInterface.register("flash_custom", hf.attention_forward)
    AttentionMaskInterface.register("flash_custom", hf.padding_mask)
    _, ours, _ = _pair("llama")
    with pytest.raises(ValueError, match="flash_custom"):
        ours.set_attn_implementation("flash_custom")


# Sliding windows, softcap and sinks.

def _without(kind: str, feature: str) -> torch.nn.Module:
    """The reference model of ``kind`` with one feature taken away (same weights)."""
    if feature != "sinks":
        return _pair(kind, **{feature: {"sliding_window": 2 * SEQ, "attn_logit_softcapping": None}[feature]})[0]
    ref, _, _ = _pair(kind)
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.sinks.fill_(-torch.inf)  # a sink of -inf is no sink
    return ref


@pytest.mark.parametrize("kind, feature", [("mistral-window", "sliding_window"), ("gemma2-window", "sliding_window"),
                                           ("gemma3-window", "sliding_window"), ("gpt-oss", "sliding_window"),
                                           ("gemma2-softcap", "attn_logit_softcapping"), ("gpt-oss", "sinks")])
def test_each_feature_moves_the_reference_logits(kind, feature):
    """So the comparisons above fail if a feature is dropped: without it the reference's logits move by far more
    than the tolerance, also when padded and packed (the documents of 5 and 6 tokens outgrow the window)."""
    ref, _, impl = _pair(kind)
    without = _without(kind, feature)
    ids, mask = _ids(), _padding("right")
    for case in ("dense", "padding", "packed"):
        logits = []
        for model in (ref, without):
            kwargs = {"dense": {}, "padding": {"attention_mask": mask},
                      "packed": _reference_packing(model, PACKED)}[case]
            logits.append(_logits(model, ids, **kwargs)[mask.bool() if case == "padding" else slice(None)])
        moved = (logits[0] - logits[1]).abs().max()
        assert moved > 100 * ATOL[impl], (case, moved)


def test_features_reach_the_calls(calls):
    _, ours, _ = _pair("gpt-oss")
    ours(_ids(), attention_mask=_padding("left"), use_cache=False)
    layers = ours.model.layers
    # The sliding layer's window in FlashAttention's terms (right side dropped by causal); none on the full layer.
    assert [c.kwargs["window_size"] for c in calls] == [(WINDOW - 1, WINDOW - 1), (-1, -1)]
    assert all(c.kwargs["causal"] is True and c.kwargs["softcap"] == 0.0 for c in calls)
    # The sinks parameters themselves (no copy, so autograd reaches them), in their own dtype.
    assert all(c.kwargs["learnable_sink"] is layer.self_attn.sinks for c, layer in zip(calls, layers))
    calls.clear()
    _, ours, _ = _pair("gemma2-softcap")
    ours(_ids(), use_cache=False)
    assert [(c.kwargs["softcap"], c.kwargs["learnable_sink"]) for c in calls] == [(50.0, None), (50.0, None)]


@pytest.mark.parametrize("window", [1, SEQ - 1, SEQ, SEQ + 3])
def test_window_off_by_one_matches_sdpa(window, calls):
    """sliding_window=SEQ - 1 hides key 0 from the last query only (each query sees itself and window - 1 tokens
    before it); a window of at least SEQ hides nothing and runs as the plain causal call."""
    ref, ours, impl = _pair("mistral-window", sliding_window=window)
    ids = _ids()
    want = _logits(ref, ids)
    torch.testing.assert_close(_logits(ours, ids), want, atol=ATOL[impl], rtol=0)
    masks = window < SEQ
    assert calls[0].kwargs["window_size"] == ((window - 1, window - 1) if masks else (-1, -1))
    moved = (want - _logits(_pair("mistral")[0], ids)).abs().max()
    assert (moved > 100 * ATOL[impl]) if masks else (moved == 0)


@pytest.mark.parametrize("q_len", [SEQ, 3])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [1, 2, 5, SEQ - 1, SEQ, SEQ + 3])
def test_sliding_window_in_the_attention_call_is_transformers_mask(window, causal, q_len):
    """Against torch's sdpa with transformers' window masks: causal layers see kv > q - window (its sliding-window
    causal mask), non-causal ones |q - kv| < window (Gemma3's bidirectional sliding layers; the flash path's
    symmetric window); q_len < SEQ are the last queries of a cache."""
    generator = torch.Generator().manual_seed(window)
    q = torch.randn(2, 4, q_len, 16, dtype=torch.float64, generator=generator)
    k, v = (torch.randn(2, 2, SEQ, 16, dtype=torch.float64, generator=generator) for _ in range(2))
    layer = torch.nn.Module()
    layer.is_causal = causal
    out, weights = hf.attention_forward(layer, q, k, v, None, sliding_window=window)
    pos, key = torch.arange(SEQ - q_len, SEQ)[:, None], torch.arange(SEQ)[None, :]
    seen = (key > pos - window) & ((key <= pos) if causal else (key < pos + window))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=seen, enable_gqa=True)
    torch.testing.assert_close(out, want.transpose(1, 2), atol=1e-12, rtol=0)
    assert weights is None


def test_on_cuda_tensors_the_kernels_refusals_propagate_and_windows_run():
    """Fake CUDA tensors (metadata only, no GPU): a softcap with a sink raises the kernels' NotImplementedError from
    the call, naming both; sinks run, and windows, whether they mask keys or not, dense and packed."""
    layer = torch.nn.Module()
    layer.is_causal = True
    with FakeTensorMode():
        q = torch.empty(1, 4, SEQ, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(1, 2, SEQ, 64, dtype=torch.bfloat16, device="cuda")
        sink = torch.empty(4, dtype=torch.bfloat16, device="cuda")
        with pytest.raises(NotImplementedError, match=r"the sm90 kernels do not support softcap=50.0 with a "
                                                      r"learnable_sink \(no softcap kernel is built for it\)"):
            hf.attention_forward(layer, q, k, k, None, softcap=50.0, s_aux=sink)
        assert hf.attention_forward(layer, q, k, k, None, s_aux=sink)[0].shape == (1, SEQ, 4, 64)
        assert hf.attention_forward(layer, q, k, k, None, sliding_window=SEQ)[0].shape == (1, SEQ, 4, 64)
        assert hf.attention_forward(layer, q, k, k, None, sliding_window=SEQ - 1)[0].shape == (1, SEQ, 4, 64)
        cu = torch.tensor([0, 6, SEQ], device="cuda")
        out, _ = hf.attention_forward(layer, q, k, k, None, sliding_window=6, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=6, max_length_k=6)
        assert out.is_cuda and out.shape == (1, SEQ, 4, 64)
        out, _ = hf.attention_forward(layer, q, k, k, None, sliding_window=5, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                      max_length_q=6, max_length_k=6)
        assert out.is_cuda and out.shape == (1, SEQ, 4, 64)


def test_on_cuda_tensors_gemma2_softcaps_run_on_the_softcap_kernels():
    """On (fake) CUDA tensors Gemma2's softcap runs on the full and causal kernels and on sliding-window layers,
    whether the window masks keys or not (Gemma 2's local layers)."""
    layer = torch.nn.Module()
    layer.is_causal = True
    with FakeTensorMode():
        q = torch.empty(1, 4, SEQ, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(1, 2, SEQ, 64, dtype=torch.bfloat16, device="cuda")
        assert hf.attention_forward(layer, q, k, k, None, softcap=50.0)[0].shape == (1, SEQ, 4, 64)
        assert hf.attention_forward(layer, q, k, k, None, softcap=50.0, sliding_window=SEQ)[0].shape == (1, SEQ, 4, 64)
        out, _ = hf.attention_forward(layer, q, k, k, None, softcap=50.0, sliding_window=SEQ - 1)
        assert out.is_cuda and out.shape == (1, SEQ, 4, 64)


def test_4d_masks_on_sliding_window_layers_must_be_windowed():
    """A 4-D mask runs if it is what the call runs: the window over the kept tokens. A causal mask without the
    window, or a padding hole (a window counted over padded positions that is not one over the kept tokens), raise."""
    ref, ours, impl = _pair("mistral-window")
    ids, mask = _ids(), _padding("left")
    real = mask.bool()
    pos, key = torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
    causal = key <= pos
    windowed = causal & (key > pos - WINDOW)
    torch.testing.assert_close(_logits(ours, ids, attention_mask=windowed & real[:, None, None, :])[real],
                               _logits(ref, ids, attention_mask=mask)[real], atol=ATOL[impl], rtol=0)
    within = r"causal pattern of this layer within its sliding window \(window_size=\(3, 3\)\)"
    with pytest.raises(ValueError, match=within):
        _logits(ours, ids, attention_mask=causal & real[:, None, None, :])
    holed = real.clone()
    holed[1, 5] = False
    with pytest.raises(ValueError, match=within):
        _logits(ours, ids, attention_mask=windowed & holed[:, None, None, :])
    # Sliding and full layers: one 4-D mask per layer type.
    ref, ours, impl = _pair("gemma3-window")
    masks = {"full_attention": causal & real[:, None, None, :], "sliding_attention": windowed & real[:, None, None, :]}
    torch.testing.assert_close(_logits(ours, ids, attention_mask=masks)[real],
                               _logits(ref, ids, attention_mask=mask)[real], atol=ATOL[impl], rtol=0)


def test_padding_mask_runs_sliding_window_layers_and_refuses_chunked_ones():
    """transformers passes local_size=config.sliding_window for sliding layers and config.attention_chunk_size for
    chunked ones, which have no mask in the kernels; a size that is neither known window nor chunk is refused."""
    mask = _padding("left").bool()
    sliding = SimpleNamespace(sliding_window=4, attention_chunk_size=None)
    assert torch.equal(hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=mask, local_size=4,
                                       config=sliding), mask)
    assert hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=None, local_size=4, config=sliding) is None
    for config in (SimpleNamespace(attention_chunk_size=4), SimpleNamespace(sliding_window=4, attention_chunk_size=4),
                   SimpleNamespace(sliding_window=8), None):
        with pytest.raises(NotImplementedError, match="local_size=4 .*chunked attention.*masks keys at 12 tokens"):
            hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=mask, local_size=4, config=config)
    # A chunk that covers the keys masks nothing.
    assert torch.equal(hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=mask, local_size=SEQ,
                                       config=SimpleNamespace(attention_chunk_size=SEQ)), mask)


def test_chunked_attention_raises_through_the_model():
    config = transformers.Llama4TextConfig(**COMMON, attention_chunk_size=WINDOW, num_local_experts=2,
                                           intermediate_size_mlp=96, no_rope_layers=[1, 0])
    assert config.layer_types == ["chunked_attention", "full_attention"]
    model = AutoModelForCausalLM.from_config(config, attn_implementation=NAME)
    with pytest.raises(NotImplementedError, match=f"local_size={WINDOW} .*chunked attention"):
        model(_ids())


def test_dropout_in_training_raises_and_eval_runs():
    _, ours, _ = _pair("llama", attention_dropout=0.1)
    ours.eval()
    ours(_ids())
    ours.train()
    with pytest.raises(NotImplementedError, match="dropout=0.1 .*not yet supported"):
        ours(_ids())


def test_mask_overlays_other_than_the_layer_pattern_raise():
    """4-D masks are checked against the layer's pattern: an overlay opening later keys to a query (as image-token
    blocks do), or packed sequences under Gemma3's bidirectional overlay, cannot run."""
    layer = torch.nn.Module()
    layer.is_causal = True
    q = torch.randn(1, 4, SEQ, 16, dtype=torch.float64)
    block = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    block[2:5, 2:5] = True
    with pytest.raises(ValueError, match=r"attention_mask \(4-D\) must be the causal pattern"):
        hf.attention_forward(layer, q, q[:, :2], q[:, :2], block.view(1, 1, SEQ, SEQ))
    _, ours, _ = _pair("gemma3", use_bidirectional_attention=True, sliding_window=4 * SEQ)
    with pytest.raises(ValueError, match=r"attention_mask \(4-D\) must be the full \(non-causal\) pattern"):
        _logits(ours, _ids(), position_ids=PACKED)


def test_a_4d_causal_mask_with_padding_runs_as_padding():
    ref, ours, impl = _pair("llama")
    ids, mask = _ids(), _padding("left")
    real = mask.bool()
    mask4 = torch.ones(SEQ, SEQ, dtype=torch.bool).tril() & real[:, None, None, :]
    torch.testing.assert_close(_logits(ours, ids, attention_mask=mask4)[real],
                               _logits(ref, ids, attention_mask=mask)[real], atol=ATOL[impl], rtol=0)
    with pytest.raises(ValueError, match="bool"):
        _logits(ours, ids, attention_mask=mask4.double())


def test_padding_mask_returns_none_without_padding_and_keeps_a_narrower_mask():
    full = torch.ones(2, SEQ, dtype=torch.long)
    assert hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=full) is None
    assert hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=None) is None
    padded = _padding("left")
    assert torch.equal(hf.padding_mask(batch_size=2, kv_length=SEQ, attention_mask=padded), padded.bool())
    # A static cache: more key slots than mask columns; the slots past the mask are dropped in the call.
    narrow = hf.padding_mask(batch_size=2, kv_length=SEQ + 4, attention_mask=full)
    assert narrow.shape == (2, SEQ)
    q = torch.randn(2, 4, SEQ, 16, dtype=torch.float64)
    k = torch.randn(2, 2, SEQ + 4, 16, dtype=torch.float64)
    layer = torch.nn.Module()
    layer.is_causal = True
    out, _ = hf.attention_forward(layer, q, k, k, narrow)
    expected, _ = hf.attention_forward(layer, q, k[:, :, :SEQ], k[:, :, :SEQ], None)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_inconsistent_packing_arguments_raise():
    _, ours, _ = _pair("llama")
    ids, cu = _ids(1), torch.tensor([0, 5, SEQ])
    with pytest.raises(ValueError, match="cu_seq_lens_k=None"):
        ours(ids, cu_seq_lens_q=cu)
    with pytest.raises(ValueError, match="either attention_mask .* or cu_seq_lens_q/cu_seq_lens_k"):
        ours(ids, attention_mask=_padding("left")[:1], cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    q = torch.randn(2, 4, SEQ, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"position_ids must be \(batch, seqlen\) = \(2, 12\)"):
        hf.attention_forward(ours.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None,
                             position_ids=torch.arange(SEQ).expand(3, SEQ))
