"""Acceptance counters under vLLM's names, and the rates derived from them, in one place.

The engine (roofline.spec.engine), real prompts (roofline.spec.real_acceptance) and a vLLM
/metrics dump (roofline.spec.vllm_metrics) all count the same four things:
num_drafts (sequence-rounds that drafted), num_draft_tokens, num_accepted_tokens and
num_accepted_tokens_per_pos (accepted at draft position i).

With nothing drafted every rate is undefined and is NaN, as in vLLM, whose draft acceptance
rate is NaN without draft tokens and which reports no mean acceptance length without drafts:
a NaN cannot be mistaken for a measurement, where 0.0 or 1.0 could.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from roofline.io.fields import ConfigError


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; NaN when the denominator is 0 (nothing was counted)."""
    return numerator / denominator if denominator else math.nan


@dataclass(frozen=True)
class AcceptanceCounters:
    drafts: int = 0  # num_drafts
    draft_tokens: int = 0  # num_draft_tokens
    accepted_tokens: int = 0  # num_accepted_tokens
    accepted_per_pos: tuple[int, ...] = ()  # num_accepted_tokens_per_pos, position 0 first

    def __add__(self, other: "AcceptanceCounters") -> "AcceptanceCounters":
        a, b = self.accepted_per_pos, other.accepted_per_pos
        n = max(len(a), len(b))
        per = tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))
        return AcceptanceCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                                  self.accepted_tokens + other.accepted_tokens, per)

    @property
    def num_positions(self) -> int:
        """k, the number of draft positions counted."""
        return len(self.accepted_per_pos)

    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (vLLM's "draft acceptance rate"); NaN with no draft tokens."""
        return ratio(self.accepted_tokens, self.draft_tokens)

    def mean_acceptance_length(self) -> float:
        """τ: tokens emitted per sequence-round, bonus/correction token included:
        1 + accepted / drafts (vLLM's definition, the τ of roofline.model.speculation); NaN with no drafts."""
        return 1.0 + ratio(self.accepted_tokens, self.drafts)

    def per_position_rate(self) -> tuple[float, ...]:
        """Unconditional acceptance accepted_pos_i / drafts: the survival s_1..s_k.
        Rounds that drafted fewer than i tokens count in the denominator (vLLM's choice)."""
        self._need_positions()
        return tuple(ratio(n, self.drafts) for n in self.accepted_per_pos)

    def per_position_alpha(self) -> tuple[float, ...]:
        """Conditional acceptance α_1..α_k: α_1 = accepted_pos_0 / drafts,
        α_i = accepted_pos_{i-1} / accepted_pos_{i-2}; NaN where nothing reached i."""
        self._need_positions()
        reached = (self.drafts,) + self.accepted_per_pos[:-1]
        return tuple(ratio(n, d) for n, d in zip(self.accepted_per_pos, reached))

    def _need_positions(self) -> None:
        if not self.accepted_per_pos:
            raise ConfigError("no per-position counters (num_accepted_tokens_per_pos): per-position "
                             "acceptance needs them (a vLLM dump from a version that exports them)")

    def vllm_names(self) -> dict:
        """The counters under vLLM's metric names (without the `vllm:spec_decode_` prefix)."""
        return dict(num_drafts=self.drafts, num_draft_tokens=self.draft_tokens,
                    num_accepted_tokens=self.accepted_tokens,
                    num_accepted_tokens_per_pos=list(self.accepted_per_pos))
