"""Small forwards per (head dim, mask, grid), for compute-sanitizer (not collected by pytest):
    compute-sanitizer --tool racecheck python tests/sanitize_fwd.py
    compute-sanitizer --tool synccheck python tests/sanitize_fwd.py
"""
import torch

from kernel_head_dims import gpu_head_dims

import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)


def main():
    torch.manual_seed(0)
    b, h, hk = 2, 2, 1  # GQA
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (300, 517): ragged tiles; (520, 130) causal: tiles without a visible key between tiles with keys.
    # A 2-CTA grid makes each CTA run many tiles back to back (the cross-tile step and O store reuse).
    # Sliding windows (the causal kernels with the window's bounds): a causal band and a two-sided one.
    # The last two with a learnable sink (the kSink kernels' finalize).
    cases = [(300, 517, False, (-1, -1), False), (300, 517, True, (-1, 0), False), (520, 130, True, (-1, 0), False),
             (700, 700, True, (128, 0), False), (300, 517, True, (64, 64), False), (520, 130, True, (-1, 0), True),
             (700, 700, True, (128, 0), True)]
    for d in gpu_head_dims():
        for sq, sk, causal, window, with_sink in cases:
            for margin in (0, sms - 2):
                q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                out = torch.empty_like(q)
                lse = torch.empty(b, h, sq, device="cuda")
                sink = torch.randn(h, device="cuda") if with_sink else None
                torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, d ** -0.5, causal, margin, *window, sink)
                torch.cuda.synchronize()
                print(f"ok d={d} sq={sq} sk={sk} causal={causal} window={window} sink={with_sink} "
                      f"grid<={sms - margin}")


if __name__ == "__main__":
    main()
