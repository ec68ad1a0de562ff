"""The varlen forward kernel (one launch per pack, offsets read on the device) against the per-sequence path.

Each sequence's out and lse must be the bits of its own dense call (the per-sequence path runs exactly those), for
packs with empty and one-token sequences, queries without keys, q/k lengths differing per sequence, seqused_*, GQA,
both masks, sliding windows, sinks and softcaps; bad offsets fill out/lse with NaN and the next call raises naming the
argument; the kernel path captures in a CUDA graph. Passing this file is what lifts
``varlen_cuda.FWD_KERNEL_VALIDATED``. Every case is marked ``gpu``.
"""
import pytest
import torch
from varlen_packs import Pack, make_pack

from flash_attn_dash import varlen_cuda

pytestmark = pytest.mark.gpu


def _random_pack(seed: int, count: int, longest: int, heads: int, heads_k: int, head_dim: int, dtype: torch.dtype,
                 same_lengths: bool, used: bool) -> Pack:
    gen = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    lens_q[:4] = [0, 1, longest, 129]  # an empty, a one-token, a long and a just-past-a-block sequence
    lens_k = list(lens_q) if same_lengths else torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    if not same_lengths:
        lens_k[4] = 0  # queries without keys
    used_q = [int(torch.randint(0, n + 1, (1,), generator=gen)) for n in lens_q] if used else None
    used_k = [int(torch.randint(0, n + 1, (1,), generator=gen)) for n in lens_k] if used else None
    return make_pack(lens_q, lens_k, heads, heads_k, head_dim, dtype, "cuda", seed=seed, used_q=used_q,
                     used_k=used_k)


def _both_paths(pack: Pack, monkeypatch, **kwargs):
    """(out, lse) of the per-sequence path and of the kernel path, on the same inputs."""
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    call = (q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], args["max_seqlen_q"], args["max_seqlen_k"],
            args["seqused_q"], args["seqused_k"])
    defaults = dict(softmax_scale=q.shape[-1] ** -0.5, causal=False, sm_margin=0, window_size=(-1, -1),
                    softcap=0.0, learnable_sink=None)
    defaults.update(kwargs)
    opts = tuple(defaults.values())
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", False)
    want = varlen_cuda.forward(*call, *opts)
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    got = varlen_cuda.forward(*call, *opts)
    torch.cuda.synchronize()
    varlen_cuda.raise_pending_error(q.device)
    return want, got


def _assert_same_bits(want, got, pack: Pack, what: str):
    (out_w, lse_w), (out_g, lse_g) = want, got
    for i, (rows_q, _) in enumerate(pack.spans()):
        assert torch.equal(out_g[rows_q], out_w[rows_q]), f"{what}: sequence {i} out differs"
        assert torch.equal(lse_g[:, rows_q], lse_w[:, rows_q]), f"{what}: sequence {i} lse differs"
    assert torch.equal(out_g, out_w) and torch.equal(lse_g, lse_w), f"{what}: rows outside the sequences differ"


@pytest.mark.parametrize("used", [False, True], ids=["whole", "seqused"])
@pytest.mark.parametrize("same_lengths", [True, False], ids=["sq=sk", "sq!=sk"])
@pytest.mark.parametrize("heads,heads_k", [(4, 4), (6, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_kernel_gives_each_sequence_its_dense_bits(monkeypatch, head_dim, dtype, causal, heads, heads_k,
                                                   same_lengths, used):
    pack = _random_pack(head_dim + 7 * causal + heads_k, 9, 700, heads, heads_k, head_dim, dtype, same_lengths, used)
    want, got = _both_paths(pack, monkeypatch, causal=causal)
    _assert_same_bits(want, got, pack, "plain")


@pytest.mark.parametrize("features", [
    dict(causal=True, window_size=(128, 0)),
    dict(causal=False, window_size=(64, 32)),
    dict(causal=True, window_size=(300, 0), softcap=30.0),
    dict(causal=False, softcap=50.0),
    dict(causal=True, sink=True),
    dict(causal=True, window_size=(128, 0), sink=True),
], ids=["causal-band", "two-sided", "band-softcap", "full-softcap", "causal-sink", "band-sink"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_kernel_features_give_each_sequence_its_dense_bits(monkeypatch, head_dim, features):
    features = dict(features)
    pack = _random_pack(head_dim, 9, 900, 8, 2, head_dim, torch.bfloat16, same_lengths=False, used=False)
    if features.pop("sink", False):
        features["learnable_sink"] = torch.randn(8, generator=torch.Generator().manual_seed(3)).cuda()
    want, got = _both_paths(pack, monkeypatch, **features)
    _assert_same_bits(want, got, pack, str(features))


def test_many_short_sequences_and_one_long(monkeypatch):
    lens = [4096] + [1 + (i * 37) % 300 for i in range(400)]
    pack = make_pack(lens, lens, 8, 8, 128, torch.bfloat16, "cuda", seed=5)
    want, got = _both_paths(pack, monkeypatch, causal=True)
    _assert_same_bits(want, got, pack, "long + 400 short")


def test_every_sequence_without_keys(monkeypatch):
    pack = make_pack([5, 70, 200], [0, 0, 0], 4, 4, 64, torch.bfloat16, "cuda", seed=2)
    want, got = _both_paths(pack, monkeypatch, causal=False)
    _assert_same_bits(want, got, pack, "no keys")
    assert torch.equal(got[0], torch.zeros_like(got[0])) and torch.isneginf(got[1]).all()


def test_sm_margin_does_not_change_the_bits(monkeypatch):
    pack = _random_pack(11, 9, 900, 4, 2, 128, torch.bfloat16, same_lengths=False, used=False)
    _, first = _both_paths(pack, monkeypatch, causal=True)
    _, other = _both_paths(pack, monkeypatch, causal=True, sm_margin=77)
    assert torch.equal(first[0], other[0]) and torch.equal(first[1], other[1])


@pytest.mark.parametrize("bad,message", [
    (lambda cu, total: cu.__setitem__(0, 1), r"cu_seqlens_q\[0\] must be 0"),
    (lambda cu, total: cu.__setitem__(2, int(cu[1]) - 1), r"cu_seqlens_q must be non-decreasing \(sequence 1"),
    (lambda cu, total: cu.__setitem__(-1, total - 1), r"cu_seqlens_q\[-1\] must equal total_q"),
], ids=["start", "order", "end"])
def test_bad_offsets_poison_the_outputs_and_the_next_call_raises(monkeypatch, bad, message):
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    pack = make_pack([100, 200, 300], [100, 200, 300], 4, 4, 64, torch.bfloat16, "cuda", seed=1)
    args = pack.args()
    bad(args["cu_seqlens_q"], pack.q.shape[0])
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    out, lse = varlen_cuda.kernel_forward(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], 300, 300, None, None,
                                          0.125, False, 0, (-1, -1), 0.0, None)
    torch.cuda.synchronize()
    assert torch.isnan(out).all() and torch.isnan(lse).all()
    with pytest.raises(ValueError, match=message):
        varlen_cuda.raise_pending_error(q.device)
    varlen_cuda.raise_pending_error(q.device)  # raised once, then cleared


def test_max_seqlen_below_a_length_is_reported(monkeypatch):
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    pack = make_pack([100, 200], [100, 200], 4, 4, 64, torch.bfloat16, "cuda", seed=1)
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    varlen_cuda.kernel_forward(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], 150, 200, None, None, 0.125,
                               False, 0, (-1, -1), 0.0, None)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"max_seqlen_q must be >= every sequence's \(used\) query length; "
                                         r"sequence 1 is longer"):
        varlen_cuda.raise_pending_error(q.device)


def test_the_kernel_path_captures_in_a_cuda_graph(monkeypatch):
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    pack = _random_pack(4, 9, 500, 4, 2, 64, torch.bfloat16, same_lengths=False, used=False)
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    call = lambda: varlen_cuda.kernel_forward(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"],  # noqa: E731
                                              args["max_seqlen_q"], args["max_seqlen_k"], None, None, 0.125, True, 0,
                                              (-1, -1), 0.0, None)
    want = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = call()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_million_token_pack_matches_per_sequence_rows(monkeypatch):
    """8 x 128k plus short sequences (1.05M tokens): no 32-bit overflow; sampled sequences against their dense calls."""
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    lens = [131072] * 8 + [1 + (i * 53) % 1000 for i in range(100)]
    heads, head_dim = 2, 64
    pack = make_pack(lens, lens, heads, heads, head_dim, torch.bfloat16, "cuda", seed=9)
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    out, lse = varlen_cuda.kernel_forward(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"],
                                          args["max_seqlen_q"], args["max_seqlen_k"], None, None, 0.125, True, 0,
                                          (-1, -1), 0.0, None)
    torch.cuda.synchronize()
    varlen_cuda.raise_pending_error(q.device)
    spans = pack.spans()
    for i in (0, 7, 8, len(lens) - 1):
        rows_q, rows_k = spans[i]
        o, l = torch.ops.flash_attn_dash.fwd(q[rows_q][None], k[rows_k][None], v[rows_k][None], 0.125, True, 0)
        assert torch.equal(out[rows_q], o[0]) and torch.equal(lse[:, rows_q], l[0]), f"sequence {i}"
