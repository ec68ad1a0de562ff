"""One small backward per (head dim, mask, mode, schedule), for compute-sanitizer (not collected by pytest):
    compute-sanitizer --tool racecheck python tests/sanitize_bwd.py
    compute-sanitizer --tool synccheck python tests/sanitize_bwd.py
The narrow windows run the GQA-folded kernels (flash_attn_dash.launch.gqa_fold), the wide one the plain window kernels.
"""
import torch

from kernel_head_dims import head_dim_v, sanitize_head_dims

from flash_attn_dash import variants
from flash_attn_dash.ops import bwd_into
from flash_attn_dash.reference import attention_ref


def main():
    torch.manual_seed(0)
    b, h, hk = 1, 2, 1  # GQA
    # (200, 300): ragged tiles, static grid; (256, 256) causal: symmetric_shift's pair grid (both modes).
    # Sliding windows run the causal kernels with the window's bounds: ascending and descending (any band); (128, 0) and
    # (64, 64) fold the GQA siblings, (2600, 0) is wider than the fold's bound at every head dim.
    # Softcaps (the Is_softcap kernels): every order of both masks, and a band (variants.SOFTCAP_WITH).
    cases = [(200, 300, False, (-1, -1), 0.0), (200, 300, True, (-1, 0), 0.0), (256, 256, True, (-1, 0), 0.0),
             (600, 600, True, (128, 0), 0.0), (300, 400, True, (64, 64), 0.0),
             (3000, 3000, True, (2600, 0), 0.0), (200, 300, False, (-1, -1), 30.0),
             (200, 300, True, (-1, 0), 5.0), (256, 256, True, (-1, 0), 30.0), (600, 600, True, (128, 0), 30.0)]
    for d in sanitize_head_dims():
        for sq, sk, causal, window, softcap in cases:
            mask = "causal" if causal else "full"
            orders = variants.schedules_for(mask) if window in ((-1, -1), (-1, 0)) else ("ascending", "descending")
            runs = [(False, "auto")] + [(True, s) for s in orders]
            for det, sched in runs:
                q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, sk, hk, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, sk, hk, head_dim_v(d), device="cuda", dtype=torch.bfloat16)
                do = torch.randn(b, sq, h, head_dim_v(d), device="cuda", dtype=torch.bfloat16)
                with torch.no_grad():
                    # (causal, window) are the kernels' (features.kernel_window): the window alone is the mask.
                    o, lse = attention_ref(q.float(), k.float(), v.float(), causal=causal and window == (-1, -1),
                                           window_size=window, softcap=softcap)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                launch = bwd_into(do, q, k, v, o.to(q.dtype), lse.float().contiguous(), dq, dk, dv, d ** -0.5,
                                  causal, det, sched, window=window, softcap=softcap)
                torch.cuda.synchronize()
                print(f"ok d={d} sq={sq} sk={sk} causal={causal} window={window} softcap={softcap} det={det} "
                      f"schedule={sched} gqa_fold={launch.gqa_fold}")
    varlen()


def varlen() -> None:
    """Small GQA packs through the varlen backward kernel (prepare CTA, table claims, per-sequence workspace tiles,
    pre/postprocess over them), every order it runs, with and without a sink; GQA on a narrow window runs the folded
    kernels (launch.varlen_kernel_launch: each sequence folds or not by its lengths), MHA on it the plain window
    kernels."""
    from varlen_packs import sanitize_pack

    from flash_attn_dash import varlen_cuda

    for d in sanitize_head_dims():
        q, k_gqa, v_gqa, cu_q, cu_k, max_q, max_k = sanitize_pack(d, head_dim_v(d))
        do = torch.randn(*q.shape[:-1], head_dim_v(d), device="cuda", dtype=q.dtype)
        sink2 = torch.randn(2, device="cuda")
        # (causal, window, sink, MHA): the MHA band runs the plain window kernels, the GQA bands fold.
        for causal, window, sink, mha in ((False, (-1, -1), None, False), (True, (-1, -1), None, False),
                                          (True, (128, 0), None, True), (True, (-1, -1), sink2, False),
                                          (True, (128, 0), None, False), (False, (64, 32), sink2, False)):
            k, v = (t.repeat(1, 2, 1) for t in (k_gqa, v_gqa)) if mha else (k_gqa, v_gqa)
            out, lse = varlen_cuda.kernel_forward(q, k, v, cu_q, cu_k, max_q, max_k, None, None, d ** -0.5, causal, 0,
                                                  window, 0.0, sink)
            up_walks = ((True, "split"), (True, "diagonal")) if causal and window == (-1, -1) else ()
            for det, sched in ((False, "auto"), (True, "ascending"), (True, "descending"), *up_walks):
                grads = [torch.zeros_like(t) for t in (q, k, v)]
                dsink = None if sink is None else torch.zeros(2, device="cuda")
                ran = varlen_cuda.kernel_backward_into(do, q, k, v, out, lse, *grads, cu_q, cu_k, max_q, max_k, None,
                                                       None, d ** -0.5, causal, det, sched, 0, window, 0.0, sink, dsink)
                torch.cuda.synchronize()
                varlen_cuda.raise_pending_error(q.device)
                print(f"ok varlen d={d} causal={causal} window={window} sink={sink is not None} det={det} "
                      f"schedule={sched} mha={mha} ran={ran}")


if __name__ == "__main__":
    main()
