"""Forward-kernel variant probe: our forward op against SDPA cuDNN, same run, same inputs.

    python benchmarks/fwd_variants.py NAME [--json OUT.json] [--seqlen 2k,4k,8k,16k] [--hdim 64,128]
                                           [--toggle NAME=V1,V2 --rounds 3]

Used to compare compile-time forward configurations (hopper/flash_fwd_launch_template.h's FLASH_DASH_FWD_*
macros) built one after another on the GPU machine; each run prints one table. Host-side knobs read at each
launch (FLASH_DASH_FWD_L2_PREFETCH) compare in one process with --toggle, interleaved over --rounds. Timing: benchmarks/common.py
(CUDA events, median of 30 after warm-up, inputs rotated over 3 sets), bf16, 16k tokens, hidden 2048.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path
from typing import List, Optional, Tuple

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import common  # noqa: E402


def fwd_calls(q, k, v, causal: bool, out=None, lse=None, sm_margin: int = 0):
    """(ours, cudnn): one forward each on (b, s, h, d) inputs; ours writes into ``out`` / ``lse`` (made here when
    None) on a grid of at most (SM count - ``sm_margin``) CTAs."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)

    b, s, h, d = q.shape
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(b, h, s, device=q.device) if lse is None else lse
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

    def ours():
        torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, d ** -0.5, causal, sm_margin)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

    return ours, cudnn


@contextlib.contextmanager
def env_set(name: Optional[str], value: Optional[str]):
    """Set os.environ[name] = value inside the block (nothing when name is None), then restore it."""
    if name is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def parse_toggle(text: str) -> Tuple[str, List[str]]:
    """'NAME=V1,V2,...' -> (NAME, [V1, V2, ...]) for --toggle."""
    name, sep, values = text.partition("=")
    vals = [v for v in values.split(",") if v]
    if not sep or not name or len(vals) < 2:
        raise argparse.ArgumentTypeError(f"--toggle wants NAME=V1,V2[,...] (two or more values), got {text!r}")
    return name, vals


def toggle_labels(toggle: Optional[Tuple[str, List[str]]]) -> List[str]:
    """Column labels of our forward: one per --toggle value ("ours NAME=V"), or just "ours"."""
    return [f"ours {toggle[0]}={v}" for v in toggle[1]] if toggle else ["ours"]


def time_fwd_pair(b: int, sq: int, sk: int, h: int, d: int, causal: bool, sm_margin: int = 0,
                  toggle: Optional[Tuple[str, List[str]]] = None, rounds: int = 1) -> tuple:
    """(ours ms, cuDNN ms): bf16 forwards on 3 rotating input sets of (b, sq|sk, h, d), median of 30 after 5
    warm-ups (benchmarks/common.py) per round, both implementations on the same inputs. With toggle=(NAME,
    values), ours runs once per value with the environment variable NAME set to it (a host-side knob read
    at each launch) and the result is (ours ms per value..., cuDNN ms). Rounds interleave all runs, so a
    slow drift of the machine hits each alike; the medians pool the samples of every round."""
    import torch

    out = torch.empty(b, sq, h, d, device="cuda", dtype=torch.bfloat16)  # one output for all sets
    lse = torch.empty(b, h, sq, device="cuda")
    sets = [fwd_calls(torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16),
                      *(torch.randn(b, sk, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(2)),
                      causal, out, lse, sm_margin) for _ in range(3)]
    name, values = toggle if toggle else (None, [None])
    runs = [(0, v) for v in values] + [(1, None)]
    samples: List[List[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for k, (which, value) in enumerate(runs):
            with env_set(name if which == 0 else None, value):
                samples[k] += common.time_cuda(lambda i: sets[i % 3][which](), iters=30, warmup=5)
    del sets
    common.free_cuda()
    return tuple(statistics.median(x) for x in samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="variant label for the table")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--seqlen", default="2k,4k,8k,16k", help="comma list (default 2k,4k,8k,16k)")
    ap.add_argument("--sm-margin", type=int, default=0, help="SMs our forward leaves unused (default 0)")
    ap.add_argument("--hdim", default="64,128", help="comma list of head dims (default 64,128)")
    ap.add_argument("--toggle", type=parse_toggle, metavar="NAME=V1,V2",
                    help="time ours once per value of the environment knob NAME (read at each launch), same process")
    ap.add_argument("--rounds", type=int, default=1, help="interleaved timing rounds per shape (default 1)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    hdims = common.parse_list(args.hdim.split(","), int)
    if any(d not in (64, 128) for d in hdims):
        ap.error(f"--hdim takes 64 and/or 128, got {args.hdim!r}")
    common.require_cuda("fwd_variants.py")

    labels = toggle_labels(args.toggle)
    rows = []
    for hdim in hdims:
        for causal in (False, True):
            for s in common.parse_list(args.seqlen.split(","), common.parse_seqlen):
                b, h = common.TOKENS_PER_BATCH // s, common.HIDDEN // hdim
                flops = common.attn_fwd_flops(b, h, s, s, hdim, causal)
                ms = time_fwd_pair(b, s, s, h, hdim, causal, args.sm_margin, args.toggle, args.rounds)
                row = {"variant": args.name, "hdim": hdim, "causal": causal, "seqlen": s,
                       "cudnn": common.tflops(flops, ms[-1])}
                row.update({label: common.tflops(flops, t) for label, t in zip(labels, ms)})
                rows.append(row)
    print(f"forward TFLOP/s, variant {args.name}" + (f", {args.rounds} interleaved rounds" if args.rounds > 1 else ""))
    print(common.text_table(["hdim", "mask", "seqlen", *labels, "cuDNN", *(f"{x}/cuDNN" for x in labels)],
                            [[r["hdim"], "causal" if r["causal"] else "full", common.seqlen_label(r["seqlen"]),
                              *(f"{r[x]:.0f}" for x in labels), f"{r['cudnn']:.0f}",
                              *(f"{r[x] / r['cudnn']:.3f}" for x in labels)] for r in rows]))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": common.collect_metadata(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
