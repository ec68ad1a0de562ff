"""How close each backward gradient comes to the tests' tolerance rule, over many seeds (GPU).

    python research/grad_margin.py --shape 799,3 --causal --hdims 64,96,128 --seeds 20

For each head dim and seed: err / bound per gradient of the rule of tests/grad_rule.py (it passes when <= 1).
A head dim whose ratios sit well above the others' over many seeds points at a kernel defect.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from grad_rule import tolerance_rule  # noqa: E402
from test_bwd_gpu import _bwd, _inputs  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="799,3", help="seqlen_q,seqlen_k")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--hdims", default="64,96,128")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args()
    sq, sk = (int(x) for x in args.shape.split(","))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    for d in (int(x) for x in args.hdims.split(",")):
        ratios: dict[str, list[float]] = {"dq": [], "dk": [], "dv": []}
        for seed in range(args.seeds):
            q, k, v, dout, out, lse = _inputs(1, sq, sk, 1, 1, d, dtype, args.causal, seed=seed)
            grads = _bwd(dout, q, k, v, out, lse, args.causal, True, "ascending")
            torch.cuda.synchronize()
            for name, err, bound in tolerance_rule(q, k, v, dout, out, grads, args.causal):
                ratios[name].append(err / bound)
        for name, rs in ratios.items():
            rs = sorted(rs)
            print(f"hdim {d} {name}: ratio median {rs[len(rs) // 2]:.3f} max {rs[-1]:.3f}; over 1 in "
                  f"{sum(r > 1 for r in rs)} of {len(rs)}")


if __name__ == "__main__":
    main()
