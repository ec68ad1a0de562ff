"""Varlen kernels, case by case, each with a deadline: which (pass, head dim, pack) hangs or differs from the
per-sequence path. Usage: python research/varlen_probe.py [--deadline S]. Prints one line per case."""
import argparse
import os
import subprocess
import sys
import time

PACKS = {"one-block": [128], "straddle": [100], "two": [100, 200], "mixed": [0, 1, 700, 129, 333, 64, 5]}
CASES = [("fwd", d, p, c, None) for d in (64, 96, 128) for p in PACKS for c in (False, True)]
CASES += [("bwd", d, p, False, det) for d in (64, 96, 128) for p in PACKS for det in (True, False)]


def child(indices, deadline):
    import torch
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from varlen_packs import make_pack
    from flash_attn_dash import varlen_cuda

    def wait():
        s = torch.cuda.current_stream()
        t0 = time.monotonic()
        while not s.query():
            if time.monotonic() - t0 > deadline:
                print("HANG", flush=True)
                os._exit(3)
            time.sleep(1e-3)

    for i in indices:
        pass_, d, name, causal, det = CASES[i]
        print(f"START {i} {pass_} d{d} {name} causal={causal} det={det}", flush=True)
        lens = PACKS[name]
        pack = make_pack(lens, lens, 4, 2, d, torch.bfloat16, "cuda", seed=i)
        a = pack.args()
        q, k, v = (t.detach() for t in (pack.q, pack.k, pack.v))
        lay = (a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"], None, None)
        varlen_cuda.FWD_KERNEL_VALIDATED = False
        out_w, lse_w = varlen_cuda.forward(q, k, v, *lay, d ** -0.5, causal, 0, (-1, -1), 0.0, None)
        torch.cuda.synchronize()
        if pass_ == "fwd":
            varlen_cuda.FWD_KERNEL_VALIDATED = True
            out_g, lse_g = varlen_cuda.forward(q, k, v, *lay, d ** -0.5, causal, 0, (-1, -1), 0.0, None)
            wait()
            varlen_cuda.raise_pending_error(q.device)
            diff = (out_g.float() - out_w.float()).abs().max().item()
            dl = (lse_g - lse_w).abs().max().item()
            print(f"OK {i} out_maxdiff={diff:.3g} lse_maxdiff={dl:.3g} equal={torch.equal(out_g, out_w)}", flush=True)
        else:
            dout = torch.randn_like(q)
            res = []
            for kern in (False, True):
                varlen_cuda.BWD_KERNEL_VALIDATED = kern
                g = [torch.zeros_like(t) for t in (q, k, v)]
                varlen_cuda.backward_into(dout, q, k, v, out_w, lse_w, *g, *lay, d ** -0.5, causal, det, "auto", 0,
                                          (-1, -1), 0.0, None, None)
                wait()
                varlen_cuda.raise_pending_error(q.device)
                res.append(g)
            diffs = " ".join(f"{n}={(x.float() - y.float()).abs().max().item():.3g}/{torch.equal(x, y)}"
                             for n, x, y in zip(("dq", "dk", "dv"), *res))
            print(f"OK {i} {diffs}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--deadline", type=float, default=10.0)
    ap.add_argument("--child", type=str, default=None)
    args = ap.parse_args()
    if args.child is not None:
        child([int(x) for x in args.child.split(",")], args.deadline)
        return
    todo = list(range(len(CASES)))
    while todo:
        p = subprocess.Popen([sys.executable, __file__, "--child", ",".join(map(str, todo)), "--deadline",
                              str(args.deadline)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = None
        for line in p.stdout:
            line = line.rstrip()
            if line.startswith("START"):
                started = int(line.split()[1])
            print(line, flush=True)
        p.wait()
        if started is None:
            break
        todo = todo[todo.index(started) + 1:]
        if p.returncode == 0:
            break
        print(f"child exited rc {p.returncode} in case {started}", flush=True)


if __name__ == "__main__":
    main()
