"""The varlen kernels (one launch per pack and pass, offsets read on the device) against the per-sequence path.

Each sequence's out and lse, and in deterministic mode its dq/dk/dv, must be the bits of its own dense call (the
per-sequence path runs exactly those), for packs with empty and one-token sequences, queries without keys, q/k lengths
differing per sequence, seqused_*, GQA/MQA, both masks, sliding windows, sinks and softcaps; non-deterministic
gradients within the FlashAttention tolerance of the deterministic ones; every row of dq/dk/dv written (they come in
poisoned); bad offsets fill the outputs with NaN and the next call raises naming the argument; the kernel paths capture
in a CUDA graph. Passing this file is what lifts
``varlen_cuda.FWD_KERNEL_VALIDATED`` and ``BWD_KERNEL_VALIDATED``. Every case is marked ``gpu``.
"""
import random

import pytest
import torch
from kernel_head_dims import dtype_id, gpu_dtypes, gpu_head_dims, head_dim_v
from test_bwd_gpu import _wait
from varlen_packs import Pack, make_pack

from flash_attn_dash import flash_attn_varlen_func, launch, variants, varlen_cuda

pytestmark = pytest.mark.gpu

HDIMS = gpu_head_dims(v_pairs=True)  # MLA's (192, 128) where built: v, out, dout and dv have head_dim_v columns
# The feature cases: hdim 64 and 128 (96 shares 128's kernels' code paths) and every entry above 128 this build has
# (their swapped dK/dV backward).
FEATURE_HDIMS = [d for d in HDIMS if d != 96]


# Feature cases of both passes (sink=True: a learnable sink of the pack's heads).
FEATURES = [dict(causal=True, window_size=(128, 0)), dict(causal=False, window_size=(64, 32)),
            dict(causal=True, window_size=(300, 0), softcap=30.0), dict(causal=False, softcap=50.0),
            dict(causal=True, sink=True), dict(causal=True, window_size=(128, 0), sink=True)]
FEATURE_IDS = ["causal-band", "two-sided", "band-softcap", "full-softcap", "causal-sink", "band-sink"]


def _features(features: dict, heads: int) -> dict:
    """The case's keyword arguments, its sink drawn (fixed seed) when it has one."""
    features = dict(features)
    if features.pop("sink", False):
        features["learnable_sink"] = torch.randn(heads, generator=torch.Generator().manual_seed(3)).cuda()
    return features


def _random_pack(seed: int, count: int, longest: int, heads: int, heads_k: int, head_dim: int, dtype: torch.dtype,
                 same_lengths: bool, used: bool) -> Pack:
    gen = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    lens_q[:4] = [0, 1, longest, 129][:count]  # an empty, a one-token, a long and a just-past-a-block sequence
    lens_k = list(lens_q) if same_lengths else torch.randint(0, longest + 1, (count,), generator=gen).tolist()
    if not same_lengths:
        if count > 4:
            lens_k[4] = 0  # queries without keys
    used_q = [int(torch.randint(0, n + 1, (1,), generator=gen)) for n in lens_q] if used else None
    used_k = [int(torch.randint(0, n + 1, (1,), generator=gen)) for n in lens_k] if used else None
    return make_pack(lens_q, lens_k, heads, heads_k, head_dim, dtype, "cuda", seed=seed, used_q=used_q,
                     used_k=used_k, head_dim_v=head_dim_v(head_dim))


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
    _wait()  # a deadlocked forward fails here instead of hanging the run
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
@pytest.mark.parametrize("dtype", gpu_dtypes(), ids=dtype_id)
@pytest.mark.parametrize("head_dim", HDIMS)
def test_kernel_gives_each_sequence_its_dense_bits(monkeypatch, head_dim, dtype, causal, heads, heads_k,
                                                   same_lengths, used):
    pack = _random_pack(head_dim + 7 * causal + heads_k, 9, 700, heads, heads_k, head_dim, dtype, same_lengths, used)
    want, got = _both_paths(pack, monkeypatch, causal=causal)
    _assert_same_bits(want, got, pack, "plain")


@pytest.mark.parametrize("features", FEATURES, ids=FEATURE_IDS)
@pytest.mark.parametrize("head_dim", FEATURE_HDIMS)
def test_kernel_features_give_each_sequence_its_dense_bits(monkeypatch, head_dim, features):
    pack = _random_pack(head_dim, 9, 900, 8, 2, head_dim, torch.bfloat16, same_lengths=False, used=False)
    features = _features(features, 8)
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


def _both_backwards(pack: Pack, dout: torch.Tensor, monkeypatch, deterministic: bool, schedule: str = "auto",
                    sm_margin: int = 0, kernel_runs: bool | None = True, **kwargs):
    """(dq, dk, dv, dsink) of the per-sequence path and of the kernel path, from the same forward; ``kernel_runs``:
    whether the second must have run the varlen kernel (None: either)."""
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    layout = (args["cu_seqlens_q"], args["cu_seqlens_k"], args["max_seqlen_q"], args["max_seqlen_k"],
              args["seqused_q"], args["seqused_k"])
    opts = dict(softmax_scale=q.shape[-1] ** -0.5, causal=False, window_size=(-1, -1), softcap=0.0,
                learnable_sink=None)
    opts.update(kwargs)
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", False)
    out, lse = varlen_cuda.forward(q, k, v, *layout, opts["softmax_scale"], opts["causal"], 0, opts["window_size"],
                                   opts["softcap"], opts["learnable_sink"])
    results = []
    ran = []
    kernel_backward_into = varlen_cuda.kernel_backward_into
    monkeypatch.setattr(varlen_cuda, "kernel_backward_into",
                        lambda *a, **kw: ran.append(kernel_backward_into(*a, **kw)) or ran[-1])
    for kernel in (False, True):
        monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", kernel)
        # Poisoned: both paths must write every row (zeros where no used key or query is seen).
        grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        sink = opts["learnable_sink"]
        dsink = None if sink is None else torch.zeros(sink.shape, dtype=torch.float32, device=q.device)
        varlen_cuda.backward_into(dout, q, k, v, out, lse, *grads, *layout, opts["softmax_scale"], opts["causal"],
                                  deterministic, schedule, sm_margin, opts["window_size"], opts["softcap"], sink,
                                  dsink)
        _wait()  # a deadlocked backward fails here instead of hanging the run
        varlen_cuda.raise_pending_error(q.device)
        results.append((*grads, dsink))
    if kernel_runs is not None:
        assert ran == [kernel_runs], f"the varlen kernel ran: {ran}, expected {kernel_runs}"
    return results


def _dout(pack: Pack) -> torch.Tensor:
    shape = (*pack.q.shape[:-1], pack.v.shape[-1])  # the output's
    return torch.randn(shape, generator=torch.Generator().manual_seed(7)).to(pack.q)


KERNEL_SCHEDULE_MASKS = [(name, causal) for causal in (False, True)
                         for name in ("auto",) + variants.schedules_for("causal" if causal else "full")
                         if name == "auto" or name in launch.VARLEN_KERNEL_ORDERS]


@pytest.mark.parametrize("schedule,causal", KERNEL_SCHEDULE_MASKS,
                         ids=[f"{'causal' if c else 'full'}-{name}" for name, c in KERNEL_SCHEDULE_MASKS])
@pytest.mark.parametrize("used", [False, True], ids=["whole", "seqused"])
@pytest.mark.parametrize("heads,heads_k", [(4, 4), (6, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("head_dim", HDIMS)
def test_deterministic_backward_kernel_gives_each_sequence_its_dense_bits(monkeypatch, head_dim, causal, heads,
                                                                         heads_k, used, schedule):
    """Every order the varlen kernel runs, on each mask that defines it."""
    pack = _random_pack(head_dim + causal + heads_k, 9, 700, heads, heads_k, head_dim, torch.bfloat16,
                        same_lengths=False, used=used)
    want, got = _both_backwards(pack, _dout(pack), monkeypatch, True, schedule, kernel_runs=True, causal=causal)
    for name, w, g in zip(("dq", "dk", "dv"), want, got):
        assert torch.equal(g, w), f"{name} differs"


@pytest.mark.parametrize("features", FEATURES, ids=FEATURE_IDS)
@pytest.mark.parametrize("head_dim", FEATURE_HDIMS)
def test_backward_kernel_features_give_each_sequence_its_dense_bits(monkeypatch, head_dim, features):
    # GQA, except on the windows the dense backward folds GQA siblings on (the folded kernels' own test below).
    heads_k = 8 if "window_size" in features else 2
    pack = _random_pack(head_dim + 1, 9, 900, 8, heads_k, head_dim, torch.bfloat16, same_lengths=False, used=False)
    features = _features(features, 8)
    want, got = _both_backwards(pack, _dout(pack), monkeypatch, True, **features)
    for name, w, g in zip(("dq", "dk", "dv"), want[:3], got[:3]):
        assert torch.equal(g, w), f"{features}: {name} differs"
    if want[3] is not None:  # the sink's gradient sums the whole pack in another order: equal to rounding
        torch.testing.assert_close(got[3], want[3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head_dim", HDIMS)
@pytest.mark.parametrize("used", [False, True], ids=["whole", "seqused"])
@pytest.mark.parametrize("features", [dict(causal=True, window_size=(128, 0)), dict(causal=False, window_size=(64, 32)),
                                      dict(causal=False, window_size=(100, 0)),
                                      dict(causal=True, window_size=(128, 0), sink=True)],
                         ids=["causal-band", "two-sided", "right-0", "band-sink"])
def test_folded_varlen_kernel_gives_each_sequence_its_dense_bits(monkeypatch, head_dim, used, features):
    """The folded varlen kernels: a GQA pack on a window the dense backward folds (launch.gqa_fold) runs in one
    launch, and each sequence gets its dense call's bits, whether it folds (long enough to keep both sides of
    the window) or not (short: one side clips nothing, so its dense call runs another mask, unfolded); the
    non-deterministic kernel within the tolerance of them."""
    lens_q = [0, 1, 2, 50, 129, 130, 131, 400, 900, 77, 34, 33]
    lens_k = [5, 1, 130, 50, 129, 131, 300, 400, 900, 0, 66, 66]
    gen = torch.Generator().manual_seed(head_dim)
    used_q = [int(torch.randint(n // 2, n + 1, (1,), generator=gen)) for n in lens_q] if used else None
    used_k = [int(torch.randint(n // 2, n + 1, (1,), generator=gen)) for n in lens_k] if used else None
    pack = make_pack(lens_q, lens_k, 8, 2, head_dim, torch.bfloat16, "cuda", seed=head_dim, used_q=used_q,
                     used_k=used_k, head_dim_v=head_dim_v(head_dim))
    features = _features(features, 8)
    want, got = _both_backwards(pack, _dout(pack), monkeypatch, True, kernel_runs=True, **features)
    for name, w, g in zip(("dq", "dk", "dv"), want[:3], got[:3]):
        assert torch.equal(g, w), f"{name} differs"
    if want[3] is not None:
        torch.testing.assert_close(got[3], want[3], rtol=1e-4, atol=1e-4)
    _, nondet = _both_backwards(pack, _dout(pack), monkeypatch, False, kernel_runs=True, **features)
    for name, d, n in zip(("dq", "dk", "dv"), want[:3], nondet[:3]):
        torch.testing.assert_close(n.float(), d.float(), rtol=2e-2, atol=2e-2, msg=name)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_nondeterministic_backward_kernel_is_close_to_the_deterministic_one(monkeypatch, causal):
    pack = _random_pack(3, 9, 900, 8, 2, 128, torch.bfloat16, same_lengths=False, used=False)
    det, _ = _both_backwards(pack, _dout(pack), monkeypatch, True, causal=causal)
    _, nondet = _both_backwards(pack, _dout(pack), monkeypatch, False, causal=causal)
    for name, d, n in zip(("dq", "dk", "dv"), det[:3], nondet[:3]):
        torch.testing.assert_close(n.float(), d.float(), rtol=2e-2, atol=2e-2, msg=name)


def test_backward_kernel_bits_do_not_depend_on_the_pack(monkeypatch):
    """The contract: a document's deterministic gradients through the kernel are the same bits alone, at another
    position and beside other documents."""
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    doc = make_pack([777], [777], 4, 2, 128, torch.bfloat16, "cuda", seed=21)
    others = make_pack([300, 1500, 5], [300, 1500, 5], 4, 2, 128, torch.bfloat16, "cuda", seed=22)
    dout_doc = _dout(doc)

    def grads_of_doc(position: int):
        lens = [300, 1500, 5]
        lens.insert(position, 777)
        starts = [sum(lens[:i]) for i in range(len(lens))]
        pieces = [others.q.detach()[sum([300, 1500, 5][:i]):sum([300, 1500, 5][:i + 1])] for i in range(3)]
        pieces.insert(position, doc.q.detach())
        q = torch.cat(pieces)
        kpieces = [others.k.detach()[sum([300, 1500, 5][:i]):sum([300, 1500, 5][:i + 1])] for i in range(3)]
        kpieces.insert(position, doc.k.detach())
        vpieces = [others.v.detach()[sum([300, 1500, 5][:i]):sum([300, 1500, 5][:i + 1])] for i in range(3)]
        vpieces.insert(position, doc.v.detach())
        k, v = torch.cat(kpieces), torch.cat(vpieces)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
        dout = torch.zeros_like(q)
        rows = slice(starts[position], starts[position] + 777)
        dout[rows] = dout_doc
        out, lse = varlen_cuda.forward(q, k, v, cu, cu, 1500, 1500, None, None, 128 ** -0.5, True, 0, (-1, -1), 0.0,
                                       None)
        grads = [torch.zeros_like(t) for t in (q, k, v)]
        varlen_cuda.backward_into(dout, q, k, v, out, lse, *grads, cu, cu, 1500, 1500, None, None, 128 ** -0.5, True,
                                  True, "auto", 0, (-1, -1), 0.0, None)
        return out[rows], grads[0][rows], grads[1][rows], grads[2][rows]

    first = grads_of_doc(0)
    for position in (1, 3):
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, grads_of_doc(position)):
            assert torch.equal(a, b), f"position {position}: {name} differs"


def test_backward_kernel_repeats_bitwise(monkeypatch):
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    pack = _random_pack(5, 12, 1200, 8, 2, 128, torch.bfloat16, same_lengths=False, used=False)
    _, first = _both_backwards(pack, _dout(pack), monkeypatch, True, causal=True)
    for _ in range(20):
        _, again = _both_backwards(pack, _dout(pack), monkeypatch, True, causal=True)
        assert all(torch.equal(a, b) for a, b in zip(first[:3], again[:3]))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_pack_repeats_bitwise_1000_times(monkeypatch, causal):
    """Forward and deterministic backward of a GQA pack through the public API, on the kernel path: the same bits of
    out, dq, dk and dv in each of 1000 runs."""
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    pack = _random_pack(11, 9, 1500, 8, 2, 128, torch.bfloat16, same_lengths=False, used=False)
    args, dout = pack.args(), _dout(pack)
    q, k, v = (t.detach().requires_grad_() for t in (pack.q, pack.k, pack.v))

    def run():
        out = flash_attn_varlen_func(q, k, v, **args, causal=causal, deterministic=True)
        return [t.view(torch.int16) for t in (out, *torch.autograd.grad(out, (q, k, v), dout))]

    first = run()
    for i in range(1000):
        got = run()
        if i % 100 == 99:
            _wait(timeout=120)
        for name, a, b in zip(("out", "dq", "dk", "dv"), first, got):
            assert torch.equal(a, b), f"run {i}: {name} bits differ"
    varlen_cuda.raise_pending_error(q.device)


def test_bad_offsets_poison_the_gradients(monkeypatch):
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    pack = make_pack([100, 200, 300], [100, 200, 300], 4, 4, 64, torch.bfloat16, "cuda", seed=1)
    args = pack.args()
    q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
    out, lse = varlen_cuda.forward(q, k, v, args["cu_seqlens_q"], args["cu_seqlens_k"], 300, 300, None, None, 0.125,
                                   False, 0, (-1, -1), 0.0, None)
    bad = args["cu_seqlens_k"].clone()
    bad[2] = 50  # sequence 1 gets a negative key length
    grads = [torch.zeros_like(t) for t in (q, k, v)]
    sink, dsink = torch.zeros(4, device="cuda"), torch.zeros(4, device="cuda")
    varlen_cuda.kernel_backward_into(_dout(pack), q, k, v, out, lse, *grads, args["cu_seqlens_q"], bad, 300, 300,
                                     None, None, 0.125, False, True, "auto", 0, (-1, -1), 0.0, sink, dsink)
    torch.cuda.synchronize()
    assert all(torch.isnan(g).all() for g in [*grads, dsink])
    with pytest.raises(ValueError, match=r"cu_seqlens_k must be non-decreasing \(sequence 1"):
        varlen_cuda.raise_pending_error(q.device)


@pytest.mark.parametrize("seed", range(40))
def test_backward_kernel_watchdog_sweep(monkeypatch, seed):
    """Random packs (GQA, masks, windows, every order the kernel runs, grids down to 2 CTAs) finish under the
    watchdog with each sequence's deterministic bits."""
    rng = random.Random(seed)
    heads_k = rng.choice([1, 2, 4])
    heads = heads_k * rng.choice([1, 2, 3])
    pack = _random_pack(seed, rng.randint(1, 14), rng.choice([200, 900, 3000]), heads, heads_k, rng.choice([64, 128]),
                        torch.bfloat16, same_lengths=rng.random() < 0.5, used=rng.random() < 0.3)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    margin = rng.choice([0, sms // 2, sms - 2])
    features = rng.choice([dict(causal=False), dict(causal=True), dict(causal=True, window_size=(200, 0)),
                           dict(causal=False, window_size=(150, 40))])
    # only the orders defined for the mask (the host refuses the others before launch)
    defined = variants.schedules_for("causal" if features["causal"] else "full")
    schedule = rng.choice([name for name in ("ascending", "descending", "diagonal") if name in defined])
    want, got = _both_backwards(pack, _dout(pack), monkeypatch, True, schedule, sm_margin=margin, kernel_runs=None,
                                **features)
    for name, w, g in zip(("dq", "dk", "dv"), want[:3], got[:3]):
        assert torch.equal(g, w), f"{features} {schedule} margin {margin}: {name} differs"
    _, nondet = _both_backwards(pack, _dout(pack), monkeypatch, False, sm_margin=margin, **features)
    assert all(torch.isfinite(g.float()).all() for g in nondet[:3])

