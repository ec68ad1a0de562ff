"""One small backward per mode, for compute-sanitizer:
    compute-sanitizer --tool racecheck python tests/sanitize_bwd.py
    compute-sanitizer --tool synccheck python tests/sanitize_bwd.py
"""
import torch

import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)
from flash_attn_dash.reference import attention_ref


def main():
    torch.manual_seed(0)
    for d in (64, 128):
        for causal in (False, True):
            for det in (False, True):
                for sched in (0, 1):
                    for (h, hk) in ((2, 2), (2, 1)):
                        b, sq, sk = 1, 200, 300
                        q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
                        k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                        v = torch.randn_like(k)
                        do = torch.randn_like(q)
                        with torch.no_grad():
                            o, lse = attention_ref(q.float(), k.float(), v.float(), causal=causal)
                        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                        torch.ops.flash_attn_dash.bwd_out(do, q, k, v, o.to(q.dtype), lse.float().contiguous(), dq, dk,
                                                          dv, None, d ** -0.5, causal, det, sched, 0)
                        torch.cuda.synchronize()
                        print(f"ok d={d} causal={causal} det={det} sched={sched} h={h} hk={hk}")


if __name__ == "__main__":
    main()
