"""Is a trained model's greedy text real text? Repetition measures of greedy continuations.

A model trained too little decodes greedily into a run of one token (the commonest one, a
newline on source code): every drafter then predicts the run and greedy acceptance is ~1
after the first position, whatever the drafter, which makes an acceptance measurement
worthless. The measures, per continuation of n tokens, averaged over continuations:

- run: the longest run of one repeated token, as a share of n; a continuation is counted as
  a *single-token run* when that run holds at least half of it;
- distinct: distinct tokens / n (a newline run: 1/n; source code: about 0.5-0.7 at n = 48);
- loop: the continuation's second half is a repetition of a period of at most 8 tokens
  (a repeated line or phrase, the next failure after single-token runs).

The same measures on the reference continuations (the held-out files' own next tokens, cut to
the same length) say what real text scores. Two verdicts go into the train summary:

- `degenerate`: single-token runs in more than a quarter of the continuations (the failure
  that makes every drafter's greedy acceptance ~1);
- `repetitive`: a mean distinct ratio below half the references', or more than half of the
  continuations ending in a loop (greedy acceptance is inflated on those continuations).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MAX_PERIOD = 8


def longest_run(seq: Sequence[int]) -> int:
    best = cur = 0
    prev = None
    for t in seq:
        cur = cur + 1 if t == prev else 1
        prev = t
        best = max(best, cur)
    return best


def loops(seq: Sequence[int], max_period: int = MAX_PERIOD) -> bool:
    """The second half of `seq` repeats one period of at most max_period tokens."""
    half = list(seq[len(seq) // 2:])
    if len(half) < 2:
        return False
    for p in range(1, min(max_period, len(half) - 1) + 1):
        if all(half[i] == half[i - p] for i in range(p, len(half))):
            return True
    return False


def repetition(seqs: Sequence[Sequence[int]]) -> dict:
    """Mean repetition measures over non-empty token sequences (see the module docstring)."""
    seqs = [list(s) for s in seqs if len(s)]
    if not seqs:
        raise ValueError("no non-empty sequence to measure")
    n = len(seqs)
    runs = [longest_run(s) / len(s) for s in seqs]
    return dict(continuations=n, tokens=sum(map(len, seqs)),
                single_token_run=sum(r >= 0.5 for r in runs) / n,
                longest_run_share=sum(runs) / n,
                distinct=sum(len(set(s)) / len(s) for s in seqs) / n,
                loop=sum(loops(s) for s in seqs) / n)


def degenerate(generated: dict) -> bool:
    """Single-token runs in over a quarter of the continuations (see the module docstring)."""
    return generated["single_token_run"] > 0.25


def repetitive(generated: dict, reference: dict) -> bool:
    """Distinct ratio under half the references', or loops in over half the continuations."""
    return generated["distinct"] < 0.5 * reference["distinct"] or generated["loop"] > 0.5


@torch.no_grad()
def greedy_continuations(model, prompts: list[list[int]], max_new: int, batch: int = 8) -> list[list[int]]:
    """Plain greedy decoding (the speculative engine with no drafter) of each prompt."""
    from roofline.spec.engine import DecodeSettings, SpecEngine

    engine, out = SpecEngine(model), []
    for i in range(0, len(prompts), batch):
        gen, _ = engine.generate(prompts[i:i + batch], DecodeSettings(max_new=max_new))
        out.extend(gen)
    return out
