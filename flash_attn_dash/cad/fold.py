"""The owner's canonical fold of a document's dK/dV partials: the only cross-chunk sum CAD does."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def fold_partials(partials: Sequence[torch.Tensor], length: int, dtype: torch.dtype) -> torch.Tensor:
    """Sum partials (rows_c, ...) into the first rows_c rows of a (length, ...) fp32 accumulator (fp64 for fp64),
    in the order given, then cast once to ``dtype``.

    Callers pass chunk order, which depends only on the document and the chunk size; any other order (say,
    the order servers return them) changes the rounding and so the bits whenever the plan changes.
    """
    first = partials[0]
    acc = torch.zeros((length, *first.shape[1:]), dtype=torch.promote_types(dtype, torch.float32),
                      device=first.device)
    for p in partials:
        acc[:p.shape[0]] += p
    return acc.to(dtype)
