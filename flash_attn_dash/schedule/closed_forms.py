"""Closed-form makespans of the DASH setting: n K/V tiles per head on n CTAs, m heads, square tiles (M = N = n).

Costs: ``c`` per compute, ``r`` per reduce (see :mod:`.simulate`).  ``T(k, j)`` below is the end of the j-th step of the
tile on CTA k within one head.

Paper forms (DASH, balanced assignment; :func:`paper_makespan`):
    full ascending ``m n (c+r) + (n-1) r``; full shift ``m n (c+r)``; causal descending ``m (n+1) (c+r) / 2 + (n-1) r``;
    causal symmetric shift ``m (n+1) (c+r) / 2``. The causal forms assume every SM does ``(n+1)/2`` steps per head.  One
    assignment that realises the descending form exactly (for even m and ``r <= c``) is "head pairs": CTA k runs tile k
    of head 2i, then tile n-1-k of head 2i+1, each descending; with ``r > c`` the reduce chains of one head pair outlast
    the computes and the form no longer holds.

Our exact model (:func:`model_makespan`, the orders of :mod:`.orders` with ``num_sms = n``; the dynamic grid's claims
head-major (claim group 1; the kernel groups heads, see :func:`.orders.claim_group`) and simulated with the same ``c``,
``r``):

* ascending / descending run on the dynamic grid (a freed CTA claims the next tile), shift on the static grid (tile t
  on CTA ``t mod n``), symmetric shift on the pair grid.
* full ascending / descending: ``m n (c+r) + (n-1) r``.  The tile on CTA k waits for CTA k-1 on every row, each CTA
  visits the rows in the same order, so ``T(k, j) = (j+1)(c+r) + k r``: CTAs free up in index order, claim tile k of
  the next head again, and the stagger carries over from head to head.
* full shift: ``m n (c+r)``: R = M = n, every rank predecessor ran one step earlier (see :mod:`.orders`), no waits.
* causal ascending: ``m n (c+r) + (n-1) r``, not ``m (n+1)(c+r)/2 + ...``: tile k (n-k steps) starts on row k, which
  waits for tile k-1's second step, ``T(k, j) = (h n + j + k + 1)(c+r) + k r`` in head h; every tile of a head ends
  at ``n (c+r) + k r`` after the head's start, so CTA k claims tile k of every head and CTA 0 runs ``m n`` steps.
* causal descending, ``r <= c``: the paper's balanced form, ``m (n+1)(c+r)/2 + (n-1) r`` for even m and
  ``(m-1)(n+1)(c+r)/2 + n (c+r)`` for odd m.  All tiles of head 0 start on row n-1 and tile k ends at ``(n-k)(c+r) +
  k r``, so the CTAs free up in reverse order and CTA k claims tile n-1-k of head 1 (the paper's head pairs, n+1
  steps per CTA); the pair ends at ``(n+1)(c+r) + k r`` on CTA k, and the next pair repeats the pattern.  An odd
  last head runs alone (its tile 0 takes ``n (c+r)``).  No closed form for ``r > c``: the reduce chains then outlast
  the computes and change the claim order.
* causal symmetric shift (n even): ``ceil(m/2) (n+1) (c+r)``.  A round holds n pairs = two whole heads, each CTA runs
  ``n + 1`` steps per pair with no waits, and odd m leaves a half-full last round; equal to the paper for even m.
"""

from __future__ import annotations

from fractions import Fraction
from numbers import Real


def _check(n: int, m: int) -> None:
    if n < 1 or m < 1:
        raise ValueError(f"n and m must be positive integers, got n={n!r}, m={m!r}")


def paper_makespan(mask: str, schedule: str, n: int, m: int, c: Real, r: Real) -> Real:
    """The DASH paper's closed form for (mask, schedule) in {full: ascending, shift; causal: descending,
    symmetric_shift}."""
    _check(n, m)
    forms = {
        ("full", "ascending"): lambda: m * n * (c + r) + (n - 1) * r,
        ("full", "shift"): lambda: m * n * (c + r),
        ("causal", "descending"): lambda: Fraction(m * (n + 1)) * (c + r) / 2 + (n - 1) * r,
        ("causal", "symmetric_shift"): lambda: Fraction(m * (n + 1)) * (c + r) / 2,
    }
    if (mask, schedule) not in forms:
        raise ValueError(f"(mask, schedule) must be one of {sorted(forms)}, got {(mask, schedule)!r}")
    return forms[mask, schedule]()


def model_makespan(mask: str, schedule: str, n: int, m: int, c: Real, r: Real) -> Real:
    """Our exact model's closed form (derivations in the module docstring); symmetric_shift needs n even, causal
    descending ``r <= c``."""
    _check(n, m)
    forms = {
        ("full", "ascending"): lambda: m * n * (c + r) + (n - 1) * r,
        ("full", "descending"): lambda: m * n * (c + r) + (n - 1) * r,
        ("full", "shift"): lambda: m * n * (c + r),
        ("causal", "ascending"): lambda: m * n * (c + r) + (n - 1) * r,
        ("causal", "descending"): lambda: (Fraction(m * (n + 1)) * (c + r) / 2 + (n - 1) * r if m % 2 == 0
                                           else Fraction((m - 1) * (n + 1)) * (c + r) / 2 + n * (c + r)),
        ("causal", "symmetric_shift"): lambda: -(-m // 2) * (n + 1) * (c + r),
    }
    if (mask, schedule) not in forms:
        raise ValueError(f"(mask, schedule) must be one of {sorted(forms)}, got {(mask, schedule)!r}")
    if schedule == "symmetric_shift" and n % 2:
        raise ValueError(f"n must be even for symmetric_shift, got n={n}")
    if (mask, schedule) == ("causal", "descending") and r > c:
        raise ValueError(f"causal descending has no closed form for r > c, got c={c!r}, r={r!r}")
    return forms[mask, schedule]()
