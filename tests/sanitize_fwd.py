"""Small forwards per (head dim, mask, grid), for compute-sanitizer (not collected by pytest):
    compute-sanitizer --tool racecheck python tests/sanitize_fwd.py
    compute-sanitizer --tool synccheck python tests/sanitize_fwd.py
"""
import torch

from kernel_head_dims import head_dim_v, sanitize_head_dims

import flash_attn_dash.ops  # noqa: F401  (defines the op schemas)


def main():
    torch.manual_seed(0)
    b, h, hk = 2, 2, 1  # GQA
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # (300, 517): ragged tiles; (520, 130) causal: tiles without a visible key between tiles with keys.
    # A 2-CTA grid makes each CTA run many tiles back to back (the cross-tile step and O store reuse).
    # Sliding windows (the causal kernels with the window's bounds): a causal band and a two-sided one.
    # Then two with a learnable sink (the kSink kernels' finalize) and four with a softcap (the kSoftcap kernels; the
    # last on a band, variants.SOFTCAP_WITH).
    cases = [(300, 517, False, (-1, -1), False, 0.0), (300, 517, True, (-1, 0), False, 0.0),
             (520, 130, True, (-1, 0), False, 0.0), (700, 700, True, (128, 0), False, 0.0),
             (300, 517, True, (64, 64), False, 0.0), (520, 130, True, (-1, 0), True, 0.0),
             (700, 700, True, (128, 0), True, 0.0), (300, 517, False, (-1, -1), False, 30.0),
             (300, 517, True, (-1, 0), False, 30.0), (520, 130, True, (-1, 0), False, 5.0),
             (700, 700, True, (128, 0), False, 30.0)]
    for d in sanitize_head_dims():
        for sq, sk, causal, window, with_sink, softcap in cases:
            for margin in (0, sms - 2):
                q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, sk, hk, head_dim_v(d), device="cuda", dtype=torch.bfloat16)
                out = torch.empty(b, sq, h, head_dim_v(d), device="cuda", dtype=torch.bfloat16)
                lse = torch.empty(b, h, sq, device="cuda")
                sink = torch.randn(h, device="cuda") if with_sink else None
                torch.ops.flash_attn_dash.fwd_out(q, k, v, out, lse, d ** -0.5, causal, margin, *window, sink,
                                                  softcap)
                torch.cuda.synchronize()
                print(f"ok d={d} sq={sq} sk={sk} causal={causal} window={window} sink={with_sink} "
                      f"softcap={softcap} grid<={sms - margin}")
    varlen(sms)


def varlen(sms: int) -> None:
    """Small packs through the varlen forward kernel (the prepare CTA, the table walk and the row-by-row O copies of
    blocks that straddle a sequence's ends, by copy warps at hdim 64), on a 2-CTA grid and a full one."""
    from varlen_packs import sanitize_pack

    from flash_attn_dash import varlen_cuda

    for d in sanitize_head_dims():
        q, k, v, cu_q, cu_k, max_q, max_k = sanitize_pack(d, head_dim_v(d))
        for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (True, (128, 0))):
            for margin in (0, sms - 2):
                varlen_cuda.kernel_forward(q, k, v, cu_q, cu_k, max_q, max_k, None, None, d ** -0.5, causal, margin,
                                           window, 0.0, None)
                torch.cuda.synchronize()
                varlen_cuda.raise_pending_error(q.device)
                print(f"ok varlen d={d} causal={causal} window={window} grid<={sms - margin}")


if __name__ == "__main__":
    main()
