"""The varlen prepare step (hopper/common/varlen.hpp) compiled as host C++ and checked against a Python model: the
offsets' checks (the first bad sequence, then the first rule it breaks, whatever the order threads find them), the
sequence views with their first workspace tiles, and the tile table the persistent grids walk (every (sequence,
block, head) once; sequences chunk by chunk in pack order, longest first within a chunk; within one sequence, heads outer on full-mask forwards, blocks longest first on
causal ones, and on the backward's key blocks (every sequence's, with or without queries) blocks ascending over head slots, so that a
rank predecessor and a GQA sibling predecessor come earlier), built chunk by chunk as the prepare CTA builds it. CPU
only: needs g++ (or c++)."""
from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from flash_attn_dash import varlen_cuda
from flash_attn_dash.schedule.orders import claim_group, claimed_tiles, slot_heads
from host_cpp import build_host_program

HEADER = Path(__file__).resolve().parents[1] / "hopper" / "common" / "varlen.hpp"
INT_MAX = 2**31 - 1
HEADS_OUTER, LONGEST_FIRST, KEY_CLAIMS = 0, 1, 2  # VarlenTileOrder

# Reads cases of: batch chunk rows heads heads_k key_blocks order grid fold_q fold_k total_q total_k max_q max_k
# has_used_q has_used_k,
# then cu_q (batch+1), cu_k (batch+1), [used_q (batch)], [used_k (batch)]. Prints "E key" for a bad pack, else the
# views "V q_start k_start len_q len_k m_start n_start folded" (64-row query and 128-row key blocks) and the table
# "T seq block_head" lines, then "END".
MIRROR_CPP = r"""
#include <algorithm>
#include <climits>
#include <cstdio>
#include <vector>
#include "common/varlen.hpp"

using namespace flash_dash;

int main() {
    int batch, chunk, rows, heads, heads_k, key_blocks, order, grid, fold_q, fold_k, total_q, total_k, max_q, max_k,
        has_uq, has_uk;
    while (std::scanf("%d %d %d %d %d %d %d %d %d %d %d %d %d %d %d %d", &batch, &chunk, &rows, &heads, &heads_k,
                      &key_blocks, &order, &grid, &fold_q, &fold_k, &total_q, &total_k, &max_q, &max_k, &has_uq,
                      &has_uk) == 16) {
        std::vector<int> cu_q(batch + 1), cu_k(batch + 1), uq(batch), uk(batch);
        for (int& x : cu_q) std::scanf("%d", &x);
        for (int& x : cu_k) std::scanf("%d", &x);
        if (has_uq) for (int& x : uq) std::scanf("%d", &x);
        if (has_uk) for (int& x : uk) std::scanf("%d", &x);
        VarlenArgs a{};
        a.cu_seqlens_q = cu_q.data();
        a.cu_seqlens_k = cu_k.data();
        a.seqused_q = has_uq ? uq.data() : nullptr;
        a.seqused_k = has_uk ? uk.data() : nullptr;
        a.max_seqlen_q = max_q;
        a.max_seqlen_k = max_k;
        // The check loop in reverse thread order: the reported key must not depend on who finds it first.
        int first = INT_MAX;
        for (int i = batch; i >= 0; --i) {
            int const key = varlen_error_at(a, i, batch, total_q, total_k);
            if (key < first) first = key;
        }
        if (first != INT_MAX) { std::printf("E %d\nEND\n", first); continue; }
        VarlenTiling const t{rows, heads, heads_k, key_blocks != 0, order, 64, 128, grid, fold_q, fold_k};
        int m_start = 0, n_start = 0;
        for (int i = 0; i < batch; ++i) {
            VarlenSeq const s = varlen_seq(a, i, t);
            std::printf("V %d %d %d %d %d %d %d\n", s.q_start, s.k_start, s.len_q, s.len_k, m_start, n_start, s.folded);
            m_start += varlen_m_blocks(s, t);
            n_start += varlen_n_blocks(s, t);
        }
        int base = 0, total = 0;
        for (int i = 0; i < batch; ++i) {
            VarlenSeq const s = varlen_seq(a, i, t);
            total += varlen_blocks(s, t) * varlen_tile_heads(s, t);
        }
        std::vector<int> prefix(chunk + 1), blocks_of(chunk), cost_of(chunk), seq_at(chunk), blocks(chunk),
            group_of(chunk), m_blocks(chunk), heads_of(chunk), tile_heads(chunk);
        for (int c0 = 0; c0 < batch; c0 += chunk) {
            for (int r = 0; r < chunk; ++r) {  // the CTA's threads, in reverse (no order may matter)
                int const i = c0 + chunk - 1 - r, rr = chunk - 1 - r;
                VarlenSeq const s = i < batch ? varlen_seq(a, i, t) : VarlenSeq{};
                blocks[rr] = i < batch ? varlen_blocks(s, t) : 0;
                tile_heads[rr] = varlen_tile_heads(s, t);
                cost_of[rr] = i < batch && blocks[rr] > 0 ? varlen_tile_cost(s, t) : -1;
                m_blocks[rr] = i < batch ? varlen_m_blocks(s, t) : 0;
            }
            for (int r = 0; r < chunk; ++r) {
                int const p = varlen_slot_rank(cost_of.data(), std::min(chunk, batch - c0), r, cost_of[r]);
                seq_at[p] = r;
                blocks_of[p] = blocks[r];
                heads_of[p] = tile_heads[r];
                group_of[p] = varlen_group(t, m_blocks[r], heads_of[p], total);
            }
            int run = 0;
            for (int p = 0; p < chunk; ++p) {
                prefix[p] = run;
                run += blocks_of[p] * heads_of[p];
            }
            prefix[chunk] = run;
            for (int j = 0; j < run; ++j) {
                int const p = varlen_find(prefix.data(), chunk, j);
                std::printf("T %d %d\n", c0 + seq_at[p], varlen_tile_block_head(j - prefix[p], blocks_of[p],
                                                                                 heads_of[p], heads_k, order,
                                                                                 group_of[p]));
            }
            base += run;
        }
        std::printf("END\n");
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    return build_host_program(tmp_path_factory, "varlen_tiles", MIRROR_CPP)


def _run(exe, cases: list[dict]) -> list[list[str]]:
    lines = []
    for c in cases:
        b = len(c["cu_q"]) - 1
        head = [b, c["chunk"], c["rows"], c["heads"], c["heads_k"], int(c["key_blocks"]), c["order"],
                c.get("grid", 132), *c.get("fold", (INT_MAX, INT_MAX)), c["total_q"],
                c["total_k"], c["max_q"], c["max_k"], int(c["used_q"] is not None), int(c["used_k"] is not None)]
        body = c["cu_q"] + c["cu_k"] + (c["used_q"] or []) + (c["used_k"] or [])
        lines.append(" ".join(map(str, head + body)))
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=300,
                         check=True).stdout
    results, current = [], []
    for line in out.splitlines():
        if line == "END":
            results.append(current)
            current = []
        else:
            current.append(line)
    return results


def _model(c: dict) -> list[str]:
    """What the prepare step must produce, written from the rules in the header's comments."""
    cu_q, cu_k, uq, uk = c["cu_q"], c["cu_k"], c["used_q"], c["used_k"]
    b = len(cu_q) - 1
    errors = []
    if cu_q[0] != 0:
        errors.append(0 * 16 + 1)
    if cu_k[0] != 0:
        errors.append(0 * 16 + 4)
    for i in range(b):
        lq, lk = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        if lq < 0:
            errors.append(i * 16 + 2)
        if lk < 0:
            errors.append(i * 16 + 5)
        used_q = uq[i] if uq is not None else lq
        used_k = uk[i] if uk is not None else lk
        if uq is not None and not 0 <= used_q <= lq:
            errors.append(i * 16 + 7)
        if uk is not None and not 0 <= used_k <= lk:
            errors.append(i * 16 + 8)
        if used_q > c["max_q"]:
            errors.append(i * 16 + 9)
        if used_k > c["max_k"]:
            errors.append(i * 16 + 10)
    if cu_q[b] != c["total_q"]:
        errors.append(b * 16 + 3)
    if cu_k[b] != c["total_k"]:
        errors.append(b * 16 + 6)
    if errors:
        return [f"E {min(errors)}"]
    views, table, m_start, n_start, lens = [], [], 0, 0, []
    fold_q, fold_k = c.get("fold", (INT_MAX, INT_MAX))
    folded = []  # GQA-folded backward: a sequence whose used lengths exceed both bounds has K/V-head tiles
    for i in range(b):
        lq = uq[i] if uq is not None else cu_q[i + 1] - cu_q[i]
        lk = uk[i] if uk is not None else cu_k[i + 1] - cu_k[i]
        folded.append(lq > fold_q and lk > fold_k)
        views.append(f"V {cu_q[i]} {cu_k[i]} {lq} {lk} {m_start} {n_start} {int(folded[-1])}")
        m_start, n_start = m_start + -(-lq // 64), n_start + -(-lk // 128)  # the mirror's q_rows / k_rows
        lens.append((lq, lk))
    # chunks of `chunk` sequences in pack order, each longest first by one tile's work (keys forward, queries
    # backward; sequences without tiles last), ties in pack order
    def cost(i):  # sequences without tiles go last
        lq, lk = lens[i]
        has_tiles = lk > 0 if c["key_blocks"] else lq > 0
        return (lq if c["key_blocks"] else lk) if has_tiles else -1

    order = []
    for c0 in range(0, b, c["chunk"]):
        order += sorted(range(c0, min(b, c0 + c["chunk"])), key=lambda i: (-cost(i), i))
    def tile_heads(i):
        return c["heads_k"] if folded[i] else c["heads"]

    for i in order:
        lq, lk = lens[i]
        length = lk if c["key_blocks"] else lq
        blocks = -(-length // c["rows"])
        heads = tile_heads(i)
        heads_k = c["heads_k"] if not folded[i] else heads  # a folded sequence's tiles have one head per K/V head
        if c["order"] == HEADS_OUTER:
            table += [f"T {i} {blk * heads + h}" for h in range(heads) for blk in range(blocks)]
        elif c["order"] == LONGEST_FIRST:
            table += [f"T {i} {blk * heads + h}" for blk in range(blocks - 1, -1, -1) for h in range(heads)]
        else:  # key claims: the dense backward's (schedule.orders), claim groups of head slots
            total = sum(tile_heads(j) * -(-(ln[1] if c["key_blocks"] else ln[0]) // c["rows"])
                        for j, ln in enumerate(lens))
            ctas = min(c.get("grid", 132), total)
            hg = claim_group(-(-lq // 64), heads, ctas)
            slot, n = claimed_tiles(np.arange(heads * blocks), blocks, hg, heads)
            head = slot_heads(slot, heads, heads_k)
            table += [f"T {i} {nn * heads + hh}" for hh, nn in zip(head.tolist(), n.tolist())]
    return views + table


def _pack(rng: random.Random, batch: int, longest: int, used: bool) -> dict:
    lens_q = [rng.choice([0, 1, rng.randint(0, longest)]) for _ in range(batch)]
    lens_k = [rng.choice([0, 1, rng.randint(0, longest)]) for _ in range(batch)]
    cu_q, cu_k = [0], [0]
    for a, b in zip(lens_q, lens_k):
        cu_q.append(cu_q[-1] + a)
        cu_k.append(cu_k[-1] + b)
    return dict(cu_q=cu_q, cu_k=cu_k, total_q=cu_q[-1], total_k=cu_k[-1], max_q=max(lens_q + [1]),
                max_k=max(lens_k + [1]), used_q=[rng.randint(0, n) for n in lens_q] if used else None,
                used_k=[rng.randint(0, n) for n in lens_k] if used else None)


def test_table_and_views_match_the_model(mirror):
    rng = random.Random(0)
    cases = []
    for _ in range(300):
        c = _pack(rng, rng.randint(0, 12), rng.choice([5, 200, 1000]), rng.random() < 0.4)
        heads_k = rng.choice([1, 2])
        c.update(chunk=rng.choice([1, 3, 4, 1024]), rows=rng.choice([64, 128, 192]),
                 heads=heads_k * rng.choice([1, 3, 4, 16]), heads_k=heads_k, key_blocks=rng.random() < 0.5,
                 order=rng.choice([HEADS_OUTER, LONGEST_FIRST, KEY_CLAIMS]), grid=rng.choice([4, 33, 132]))
        if c["key_blocks"] and c["order"] == KEY_CLAIMS and rng.random() < 0.5:
            c["fold"] = (rng.choice([0, 1, 3]), rng.choice([2, 65, 129]))
        cases.append(c)
    for c, got in zip(cases, _run(mirror, cases)):
        assert got == _model(c), c


def test_every_tile_appears_once(mirror):
    rng = random.Random(1)
    c = _pack(rng, 40, 3000, False)
    c.update(chunk=7, rows=128, heads=5, heads_k=5, key_blocks=False, order=LONGEST_FIRST)
    (got,) = _run(mirror, [c])
    tiles = [tuple(map(int, line.split()[1:])) for line in got if line.startswith("T")]
    expected = {(i, blk * 5 + h) for i in range(40) for blk in range(-(-(c["cu_q"][i + 1] - c["cu_q"][i]) // 128))
                for h in range(5)}
    assert len(tiles) == len(set(tiles)) and set(tiles) == expected


@pytest.mark.parametrize("break_it,code,seq", [
    (lambda c: c["cu_q"].__setitem__(0, 1), 1, 0),
    (lambda c: c["cu_k"].__setitem__(0, 2), 4, 0),
    (lambda c: c["cu_q"].__setitem__(2, c["cu_q"][1] - 1), 2, 1),
    (lambda c: c.__setitem__("total_q", c["total_q"] + 1), 3, 4),
    (lambda c: c.__setitem__("total_k", c["total_k"] - 1), 6, 4),
    (lambda c: c.__setitem__("used_q", [0, 0, 10**6, 0]), 7, 2),
    (lambda c: c.__setitem__("used_k", [0, -1, 0, 0]), 8, 1),
    (lambda c: c.__setitem__("max_q", 1), 9, 0),
    (lambda c: c.__setitem__("max_k", 1), 10, 0),
], ids=["q-start", "k-start", "q-order", "q-end", "k-end", "used-q", "used-k", "max-q", "max-k"])
def test_each_bad_offset_is_reported_with_its_sequence(mirror, break_it, code, seq):
    c = dict(cu_q=[0, 10, 30, 60, 100], cu_k=[0, 20, 40, 60, 80], total_q=100, total_k=80, max_q=40, max_k=20,
             used_q=None, used_k=None, chunk=1024, rows=128, heads=2, heads_k=1, key_blocks=False, order=HEADS_OUTER)
    break_it(c)
    (got,) = _run(mirror, [c])
    assert got == [f"E {seq * 16 + code}"] == _model(c)
    message = varlen_cuda.status_message(code, seq)
    names = {1: "cu_seqlens_q", 2: "cu_seqlens_q", 3: "cu_seqlens_q", 4: "cu_seqlens_k", 5: "cu_seqlens_k",
             6: "cu_seqlens_k", 7: "seqused_q", 8: "seqused_k", 9: "max_seqlen_q", 10: "max_seqlen_k"}
    assert names[code] in message


def test_status_messages_cover_the_header_codes():
    """Every VarlenError code of the header has a message naming its argument, and no message a code it lacks."""
    codes = {int(v) for v in re.findall(r"kVarlen\w+ = (\d+),", HEADER.read_text()) if int(v) != 0}
    assert codes == set(varlen_cuda._STATUS_MESSAGES)


def test_a_pending_error_is_raised_once(monkeypatch):
    import torch
    word = torch.tensor([2, 5], dtype=torch.int32)
    monkeypatch.setattr(varlen_cuda, "status_word", lambda device: word)
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be non-decreasing \(sequence 5 has a negative length\)"):
        varlen_cuda.raise_pending_error(torch.device("cpu"))
    varlen_cuda.raise_pending_error(torch.device("cpu"))
    assert word.tolist() == [0, 0]


def test_key_claims_put_every_predecessor_first(mirror):
    """The backward's deadlock-freedom needs it (policies.hpp): in table order, tile (n, h)'s rank predecessor
    (n - 1, h) and its GQA sibling predecessor (n, h - 1 of the same K/V head) come earlier."""
    rng = random.Random(2)
    c = _pack(rng, 6, 2000, False)
    c.update(chunk=4, rows=128, heads=8, heads_k=2, key_blocks=True, order=KEY_CLAIMS, grid=20)
    (got,) = _run(mirror, [c])
    position = {tuple(map(int, line.split()[1:])): p for p, line in enumerate(l for l in got if l.startswith("T"))}
    assert position
    for (seq, block_head), p in position.items():
        n, h = divmod(block_head, 8)
        if n > 0:
            assert position[(seq, (n - 1) * 8 + h)] < p
        if h % 4 > 0:  # 4 siblings per K/V head
            assert position[(seq, n * 8 + h - 1)] < p


def test_folded_sequences_have_one_tile_per_kv_head(mirror):
    """GQA-folded backward packs: a sequence whose used lengths exceed the fold bounds gets one tile per (key block,
    K/V head), the others one per (key block, query head), each once, and within a sequence the rank predecessor
    (n - 1, same head) and (unfolded) the sibling predecessor come earlier in the table."""
    rng = random.Random(3)
    c = _pack(rng, 12, 1500, False)
    c.update(chunk=5, rows=128, heads=8, heads_k=2, key_blocks=True, order=KEY_CLAIMS, grid=20, fold=(1, 129))
    (got,) = _run(mirror, [c])
    views = [line.split() for line in got if line.startswith("V")]
    folded = [v[-1] == "1" for v in views]
    lens = [(int(v[3]), int(v[4])) for v in views]
    assert folded == [lq > 1 and lk > 129 for lq, lk in lens] and any(folded) and not all(folded)
    tiles = [tuple(map(int, line.split()[1:])) for line in got if line.startswith("T")]
    position = {t: p for p, t in enumerate(tiles)}
    assert len(position) == len(tiles)
    expected = set()
    for i, (lq, lk) in enumerate(lens):
        heads = 2 if folded[i] else 8
        expected |= {(i, n * heads + h) for n in range(-(-lk // 128)) for h in range(heads)}
    assert set(tiles) == expected
    for (seq, block_head), p in position.items():
        heads = 2 if folded[seq] else 8
        n, h = divmod(block_head, heads)
        if n > 0:
            assert position[(seq, (n - 1) * heads + h)] < p
        if not folded[seq] and h % 4 > 0:
            assert position[(seq, n * heads + h - 1)] < p


WORKSPACE_CPP = r"""
#include <cstdio>
#include <vector>
#include "common/varlen.hpp"

using namespace flash_dash;

int main() {
    long long batch, capacity;
    while (std::scanf("%lld %lld", &batch, &capacity) == 2) {
        long long const bytes = varlen_workspace_bytes(batch, capacity);
        std::vector<long long> buffer(bytes / 8 + 1);
        VarlenWorkspace const w = varlen_workspace(buffer.data(), batch);
        auto at = [&](void const* p) {
            return static_cast<long long>(static_cast<char const*>(p) - reinterpret_cast<char const*>(buffer.data()));
        };
        std::printf("%lld %lld %lld %lld %lld\n", at(w.seqs + batch), at(w.num_tiles), at(w.claims), at(w.tiles),
                    bytes);
    }
    return 0;
}
"""


def test_the_claim_counter_shares_the_count_slot(tmp_path_factory):
    """The forward's claim counter (reset by the prepare CTA, claimed from by the kernel) sits in the tile count's
    16-byte slot: after the views, before the table, which keeps its offset and the workspace its size."""
    exe = build_host_program(tmp_path_factory, "varlen_workspace", WORKSPACE_CPP)
    cases = [(0, 0), (1, 5), (3, 40), (7, 1000), (1000, 123456)]
    out = subprocess.run([str(exe)], input="".join(f"{b} {c}\n" for b, c in cases), capture_output=True, text=True,
                         timeout=60, check=True).stdout
    for (batch, capacity), line in zip(cases, out.splitlines(), strict=True):
        views_end, count, claims, tiles, total = map(int, line.split())
        assert views_end <= count and count % 16 == 0 and claims == count + 4 and claims + 4 <= tiles == count + 16
        assert total == tiles + 8 * capacity


def test_the_kernels_path_reads_no_offsets_on_the_host(monkeypatch):
    """The varlen kernels' host path (issue 18 point 3) never reads cu_seqlens / seqused: no device-to-host copy, so
    it is CUDA-graph capturable and its cost does not grow with the pack. Checked on fake CUDA tensors with the
    kernels' gates on and the ops stubbed: reading the layout raises."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from flash_attn_dash import checks, varlen_layout

    def no_read(*args, **kwargs):
        raise AssertionError("the kernels' path read the offsets on the host")

    calls = []
    monkeypatch.setattr(varlen_cuda, "FWD_KERNEL_VALIDATED", True)
    monkeypatch.setattr(varlen_cuda, "BWD_KERNEL_VALIDATED", True)
    monkeypatch.setattr(varlen_cuda, "read_layout", no_read)
    monkeypatch.setattr(varlen_layout, "read_layout", no_read)
    monkeypatch.setattr(varlen_cuda, "raise_pending_error", lambda device: None)
    monkeypatch.setattr(varlen_cuda, "status_word", lambda device: torch.zeros(2, dtype=torch.int32))
    monkeypatch.setattr(checks, "check_sm_margin", lambda sm_margin, device: 132 - sm_margin)
    monkeypatch.setattr(varlen_cuda.ops, "check_cuda_inputs", lambda *a, **k: None)

    class Ops:
        @staticmethod
        def varlen_fwd_out(*args):
            calls.append("fwd")

        @staticmethod
        def varlen_bwd_out(*args):
            calls.append("bwd")

    monkeypatch.setattr(torch.ops, "flash_attn_dash", Ops, raising=False)
    with FakeTensorMode():
        q = torch.empty(1000, 4, 64, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(1000, 2, 64, dtype=torch.bfloat16, device="cuda")
        cu = torch.empty(11, dtype=torch.int32, device="cuda")
        out, lse = varlen_cuda.forward(q, k, k, cu, cu, 400, 400, None, None, 0.125, True, 0, (-1, -1), 0.0, None)
        grads = [torch.empty_like(t) for t in (q, k, k)]
        varlen_cuda.backward_into(q, q, k, k, out, lse, *grads, cu, cu, 400, 400, None, None, 0.125, True, True,
                                  "auto", 0, (-1, -1), 0.0, None)
    assert calls == ["fwd", "bwd"]
