"""N-gram prompt lookup: draft tokens by copying what followed the same suffix earlier.

The cheapest drafter there is (no weights, no forward pass): if the last few tokens of the
context already appeared earlier, guess that what followed them then follows them again.
It pays on repetitive text (code edits, retrieval, summaries quoting their source), where
its acceptance rate is high at a drafting cost of a few microseconds on the host.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from roofline.io.fields import ConfigError


def propose(
    context: Sequence[int] | torch.Tensor,
    k: int,
    max_ngram: int = 3,
    min_ngram: int = 1,
) -> list[int]:
    """Up to k draft tokens for `context`, or [] when no suffix recurs.

    Tries suffix lengths n = max_ngram down to min_ngram and stops at the first (longest)
    suffix that also occurs earlier in the context, at its most recent earlier occurrence
    (occurrences may overlap the suffix). The proposal is the tokens that followed that
    occurrence, at most k of them, fewer when the context ends first.
    """
    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k!r}")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(
            f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram!r}, max_ngram={max_ngram!r}"
        )
    if isinstance(context, torch.Tensor):
        if context.dim() != 1:
            raise ValueError(f"context must be 1-D, got shape {tuple(context.shape)}")
        tokens = context.detach().cpu().numpy()
    else:
        tokens = np.asarray(context, dtype=np.int64)
    length = len(tokens)
    if k == 0:
        return []
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # Windows that start at 0 .. length-n-1 end before the last token, so each is an
        # earlier occurrence with at least one token after it.
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        starts = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if starts.size:
            begin = int(starts[-1]) + n
            return [int(t) for t in tokens[begin : begin + k]]
    return []
