"""Stress the deterministic backward for order races: the same call many times, alone and beside a concurrent
matmul on another stream (CTAs start late), counting runs whose dq/dk/dv bits differ from the first, and dQ arrival
traces that differ from the schedule model's. Sliding windows beside the causal mask as control."""
import sys

import numpy as np
import torch

sys.path.insert(0, "tests")
from test_bwd_gpu import _blocks, _inputs, _trace_buffer  # noqa: E402
from test_window_gpu import _bwd_window, _kernel  # noqa: E402

from flash_attn_dash.launch import model_mask  # noqa: E402
from flash_attn_dash.schedule import build_plan  # noqa: E402

REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
side = torch.cuda.Stream()
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
num_sms = torch.cuda.get_device_properties(0).multi_processor_count


def stress(sq, h, hk, d, causal, window, schedule="auto"):
    q, k, v, dout, out, lse = _inputs(1, sq, sq, h, hk, d, torch.bfloat16, causal, window_size=window)
    first, launch = _bwd_window(dout, q, k, v, out, lse, causal, window, True, schedule)
    kc, kw = _kernel(causal, window, sq, sq)
    plan = build_plan(model_mask(kc, kw), sq, sq, *_blocks(d), 1, h, num_sms, launch.schedule, heads_kv=hk,
                      claim_heads=launch.claim_group, window=kw)
    expect = plan.trace_array()
    bits, traces = [0, 0, 0], 0
    for r in range(REPS):
        if r % 2:
            with torch.cuda.stream(side):
                for _ in range(3):
                    a @ a
        trace = _trace_buffer(1, h, sq, sq, d) if r % 4 == 3 else None
        grads, _ = _bwd_window(dout, q, k, v, out, lse, causal, window, True, schedule, trace=trace)
        torch.cuda.synchronize()
        for i, (x, y) in enumerate(zip(first, grads)):
            bits[i] += not torch.equal(x, y)
        if trace is not None:
            traces += int((trace.cpu().numpy().astype(np.int32) != expect).any())
    print(f"sq={sq} h={h}/{hk} d={d} causal={causal} window={window} {launch.schedule} grid={launch.grid}: "
          f"runs with other bits (dq, dk, dv) {bits} of {REPS}, traces off model {traces} of {REPS // 4}", flush=True)


for d in (64, 128):
    for sq in (284, 347, 1000):
        for causal, window in ((True, (63, 0)), (True, (-1, -1)), (False, (64, 64))):
            stress(sq, 8, 2, d, causal, window)
stress(347, 8, 8, 64, True, (63, 0))
stress(347, 8, 2, 64, True, (63, 0), "ascending")
