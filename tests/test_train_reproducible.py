"""The reproducible-training demo (examples/train_reproducible.py): a tiny CPU run end to end, its data and masking,
its divergence report, its argument checks; and a short CUDA run (marked ``gpu``)."""
import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

_PATH = Path(__file__).resolve().parents[1] / "examples" / "train_reproducible.py"
_SPEC = importlib.util.spec_from_file_location("train_reproducible", _PATH)
tr = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = tr  # dataclasses look their module up by name
_SPEC.loader.exec_module(tr)

STEPS = 8
TINY = ["--steps", str(STEPS), "--layers", "1", "--d-model", "32", "--heads", "4", "--kv-heads", "2",
        "--seq-len", "48", "--batch", "2", "--lr", "3e-2"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One tiny CPU demo run: (the returned record, its output directory, what it printed)."""
    out = tmp_path_factory.mktemp("demo")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        record = tr.main(TINY + ["--out", str(out)])
    return record, out, printed.getvalue().splitlines()


def test_deterministic_pair_is_bitwise_identical(demo):
    record, _, _ = demo
    pair = record["pairs"]["dash-det"]
    assert pair["identical"] and pair["final_weights_identical"], pair["verdict"]
    assert pair["first_divergence"] is None and pair["torch_deterministic_algorithms"] is True
    one, two = record["runs"]["dash-det-1"], record["runs"]["dash-det-2"]
    assert [x.hex() for x in one["losses"]] == [x.hex() for x in two["losses"]]
    assert one["fingerprints"] == two["fingerprints"]
    # The fingerprint sees every update: identical fingerprints are evidence, not a constant.
    assert len(set(one["fingerprints"])) == STEPS


def test_loss_decreases(demo):
    losses = demo[0]["runs"]["dash-det-1"]["losses"]
    assert len(losses) == STEPS
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses  # from ln(256) = 5.5 towards the n-grams


def test_outputs_and_verdicts(demo):
    record, out, printed = demo
    png, path = out / "train-reproducible-cpu.png", out / "train-reproducible-cpu.json"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads(path.read_text())
    assert written == json.loads(json.dumps(record))
    assert {"config", "device", "torch", "commit", "runs", "pairs", "result"} <= set(written)
    assert written["torch"] == torch.__version__ and written["device"] == "cpu" and written["commit"]
    assert set(written["pairs"]) == {"dash-det", "dash-nondet", "sdpa"}
    assert set(written["runs"]) == {f"{pair}-{run}" for pair in written["pairs"] for run in (1, 2)}
    for name, pair in written["pairs"].items():
        assert {"identical", "first_divergence", "first_loss_divergence", "first_weight_divergence",
                "final_weights_identical", "verdict"} <= set(pair)
        assert pair["verdict"].startswith(name)
        # On the CPU every pair is what it is observed to be; the verdict must agree with the recorded bits.
        runs = [written["runs"][f"{name}-{run}"] for run in (1, 2)]
        same = runs[0]["losses"] == runs[1]["losses"] and runs[0]["fingerprints"] == runs[1]["fingerprints"]
        assert pair["identical"] == same
    assert printed[-4:] == [p["verdict"] for p in written["pairs"].values()] + [written["result"]]
    assert written["result"].startswith(f"RESULT (cpu, float32, {STEPS} steps): dash-det bitwise identical")


def test_commit_prefers_git_commit_env(monkeypatch):
    monkeypatch.setenv("GIT_COMMIT", "0123abc")
    assert tr.git_commit() == "0123abc"
    monkeypatch.delenv("GIT_COMMIT")
    checkout = Path(tr.flash_attn_dash.__file__).parent
    assert tr.git_commit().split("-")[0] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout,
                                                           capture_output=True, text=True).stdout.strip()


def test_batches_are_reproducible_packs():
    cfg = tr.parse_args(TINY)
    batches = tr.make_batches(cfg)
    again = tr.make_batches(cfg)
    other = tr.make_batches(tr.parse_args(TINY + ["--seed", "1"]))
    assert all(torch.equal(a.tokens, b.tokens) and torch.equal(a.cu_seqlens, b.cu_seqlens)
               for a, b in zip(batches, again))
    assert not all(torch.equal(a.tokens, b.tokens) for a, b in zip(batches, other))
    assert len(batches) == STEPS and max(len(b.cu_seqlens) for b in batches) > 3  # several documents per batch
    for batch in batches:
        assert batch.tokens.shape == (cfg.batch, cfg.seq_len)
        tokens, targets, positions = (t.flatten() for t in (batch.tokens, batch.targets, batch.positions))
        offsets = batch.cu_seqlens.tolist()
        assert offsets[0] == 0 and offsets[-1] == tokens.numel()
        for start, end in zip(offsets, offsets[1:]):
            assert positions[start:end].tolist() == list(range(end - start))
            assert torch.equal(targets[start:end - 1], tokens[start + 1:end]) and targets[end - 1] == tr.IGNORE
        assert batch.max_seqlen == max(e - s for s, e in zip(offsets, offsets[1:]))


def _whole_row_causal(q, k, v, batch):
    """A leaking control: causal over the whole row, ignoring document boundaries."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)


@pytest.mark.parametrize("attention,leaks", [(tr.dash_attention(True), False), (tr.dash_attention(False), False),
                                             (tr.sdpa_attention, False), (_whole_row_causal, True)],
                         ids=["dash-det", "dash-nondet", "sdpa", "control-whole-row-causal"])
def test_documents_do_not_attend_across_boundaries(attention, leaks):
    cfg = tr.parse_args(TINY)
    torch.manual_seed(0)
    model = tr.GPT(cfg)
    gen = torch.Generator().manual_seed(0)
    doc_a, doc_b, doc_c, doc_d = (torch.randint(1, cfg.vocab, (n,), generator=gen).tolist() for n in (7, 9, 8, 24))
    changed_a = [(t + 1) % cfg.vocab for t in doc_a]
    # Document A comes first in its row: a causal mask alone would let B and C see it.
    with torch.no_grad():
        before, after = (model(tr.pack_batch([[a, doc_b, doc_c], [doc_d]]), attention)
                         for a in (doc_a, changed_a))
    a_rows, later_rows = slice(0, 7), slice(7, 24)
    assert not torch.equal(before[0, a_rows], after[0, a_rows])
    assert torch.equal(before[1], after[1])  # another row
    assert torch.equal(before[0, later_rows], after[0, later_rows]) != leaks


def _run(losses, fingerprints, weight):
    return tr.RunResult(losses, fingerprints, {"w": torch.full((2,), weight), "b": torch.zeros(1)}, 0.0)


def test_divergence_report_and_plot(tmp_path):
    cfg = tr.parse_args(["--steps", "6", "--out", str(tmp_path)])
    losses = [5.0, 4.0, 3.5, 3.0, 2.8, 2.6]
    fingerprints = list("abcdef")
    runs = {"dash-det-1": _run(losses, fingerprints, 1.0), "dash-det-2": _run(list(losses), list(fingerprints), 1.0),
            # weights first differ after step 3 (fingerprint), so the loss first differs at step 4
            "dash-nondet-1": _run(losses, fingerprints, 1.0),
            "dash-nondet-2": _run(losses[:3] + [3.0 + 2e-6, 2.8 + 1e-4, 2.6 + 1e-2], list("abwxyz"), 1.5),
            # a loss that differs with equal weights (a non-deterministic forward) is a divergence too
            "sdpa-1": _run(losses, fingerprints, 1.0), "sdpa-2": _run(losses[:5] + [2.6000001], fingerprints, 1.0)}
    det, nondet, sdpa = (tr.compare_runs(spec, runs[f"{spec.name}-1"], runs[f"{spec.name}-2"]) for spec in tr.PAIRS)
    assert det.identical and det.first_divergence is None and "no divergence in 6 steps" in det.verdict()
    assert not nondet.identical
    assert (nondet.first_weight_divergence, nondet.first_loss_divergence, nondet.first_divergence) == (3, 4, 3)
    assert (nondet.differing_tensors, nondet.tensors, nondet.max_abs_weight_diff) == (1, 2, 0.5)
    assert nondet.max_abs_loss_diff == pytest.approx(1e-2)
    assert "diverged at step 3 of 6" in nondet.verdict() and "weights first differ after step 3" in nondet.verdict()
    assert (sdpa.first_weight_divergence, sdpa.first_loss_divergence, sdpa.final_weights_identical) == (None, 6, True)
    assert not sdpa.identical
    assert tr.result_line(cfg, [det, nondet, sdpa]) == (
        "RESULT (cpu, float32, 6 steps): dash-det bitwise identical; dash-nondet diverged at step 3; "
        "sdpa diverged at step 6")
    tr.plot(tmp_path / "divergent.png", cfg, runs, [det, nondet, sdpa], "divergent")
    assert (tmp_path / "divergent.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv,message", [
    (["--heads", "6", "--kv-heads", "4", "--d-model", "48"], "--heads 6 must be a multiple of --kv-heads 4"),
    (["--d-model", "30", "--heads", "4"], "--d-model 30 must be a multiple of --heads 4"),
    (["--d-model", "24", "--heads", "8", "--kv-heads", "1"], "head dim --d-model / --heads = 3 must be even"),
    (["--device", "cuda", "--d-model", "256", "--heads", "8"], "= 32: the CUDA kernels support head dims 64 and 128"),
    (["--device", "cuda", "--dtype", "float32"], "--dtype float32: on cuda the kernels run bfloat16"),
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--kv-heads", "0"], "--kv-heads must be >= 1, got 0"),
    (["--lr", "-1"], "--lr must be > 0"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
])
def test_bad_arguments_fail_before_training(monkeypatch, capsys, tmp_path, argv, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(tr, "make_batches", must_not_run)
    monkeypatch.setattr(tr, "train", must_not_run)
    with pytest.raises(SystemExit) as exit_info:
        tr.main(argv + ["--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_gpu_fails_clearly(capsys):
    with pytest.raises(SystemExit):
        tr.parse_args(["--device", "cuda"])
    assert "--device cuda needs a CUDA GPU and flash-attn-dash's compiled kernels" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_deterministic_pair_is_bitwise_identical(tmp_path):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        record = tr.main(["--device", "cuda", "--steps", "6", "--layers", "2", "--d-model", "256", "--heads", "4",
                          "--kv-heads", "2", "--seq-len", "1024", "--batch", "2", "--out", str(tmp_path)])
    pair = record["pairs"]["dash-det"]
    assert pair["identical"] and pair["final_weights_identical"], pair["verdict"]
    assert record["config"]["dtype"] == "bfloat16" and (tmp_path / "train-reproducible-cuda.png").exists()
