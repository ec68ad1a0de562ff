"""One small backward per (head dim, mask, mode, schedule), for compute-sanitizer (not collected by pytest):
    compute-sanitizer --tool racecheck python tests/sanitize_bwd.py
    compute-sanitizer --tool synccheck python tests/sanitize_bwd.py
"""
import torch

import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)
from flash_attn_dash.ops import KERNEL_SCHEDULES, SCHEDULE_IDS
from flash_attn_dash.reference import attention_ref

MASK_ONLY = {"shift": False, "symmetric_shift": True}


def main():
    torch.manual_seed(0)
    b, h, hk = 1, 2, 1  # GQA
    # (200, 300): ragged tiles, static grid; (256, 256) causal: symmetric_shift's pair grid (both modes).
    cases = [(200, 300, False), (200, 300, True), (256, 256, True)]
    for d in (64, 128):
        for sq, sk, causal in cases:
            runs = [(False, "ascending")] + [(True, s) for s in KERNEL_SCHEDULES if MASK_ONLY.get(s, causal) == causal]
            for det, sched in runs:
                q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                v, do = torch.randn_like(k), torch.randn_like(q)
                with torch.no_grad():
                    o, lse = attention_ref(q.float(), k.float(), v.float(), causal=causal)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                torch.ops.flash_attn_dash.bwd_out(do, q, k, v, o.to(q.dtype), lse.float().contiguous(), dq, dk, dv,
                                                  None, d ** -0.5, causal, det, SCHEDULE_IDS[sched], 0)
                torch.cuda.synchronize()
                print(f"ok d={d} sq={sq} sk={sk} causal={causal} det={det} schedule={sched}")


if __name__ == "__main__":
    main()
