"""The speculative decoding engine: draft k, verify k+1 in ONE target forward, accept, bonus.

Batched with ragged acceptance: every sequence keeps its own cache length and its own pending
token (emitted, not yet in the cache), so no sequence waits for or is cut to another's. A
round feeds [pending, d_1..d_k] at each sequence's own position; the cache then holds valid
entries up to pending + the accepted drafts, and rolling back is by position only: entries
past a sequence's length are masked until the next forward overwrites them.

Greedy (accept while the draft equals the target's argmax) and sampling (min(1, p/q),
residual on rejection, bonus from p) both come from `roofline.spec.verify`, so the output is
the target's own: greedy token for token, sampling in distribution (tests prove both).

Metrics follow vLLM's names (num_drafts, num_draft_tokens, num_accepted_tokens, accepted per
position; mean acceptance length = 1 + accepted / drafts) and each round's wall time is split
into draft, verify and the rest (acceptance, bookkeeping, host syncs): the O(k, B) of
docs/design.md §2, measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from roofline.spec.counters import AcceptanceCounters
from roofline.spec.verify import greedy_accept, pick, probs_from_logits, sample_accept
from roofline.model.decoder import Transformer
from roofline.io.fields import ConfigError


@dataclass(frozen=True)
class DecodeSettings:
    max_new: int
    k: int = 0  # drafts per round; 0 = plain decoding
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    eos: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new < 1:
            raise ConfigError(f"max_new={self.max_new}: must be >= 1")
        if self.k < 0:
            raise ConfigError(f"k={self.k}: must be >= 0")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ConfigError(f"temperature={self.temperature}, top_p={self.top_p}: need temperature >= 0, 0 < top_p <= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SpecMetrics:
    k: int
    counters: AcceptanceCounters = AcceptanceCounters()
    rounds: int = 0
    emitted: int = 0
    wall_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    steady_s: float = 0.0  # rounds in which every sequence was active from start to end
    steady_tokens: int = 0
    steady_rounds: int = 0
    untimed_s: float = 0.0  # a drafter's set-up outside the measured decode (the oracle's shadow passes)

    @property
    def overhead_s(self) -> float:
        """Round time spent outside drafting and verification (acceptance, bookkeeping)."""
        return self.wall_s - self.prefill_s - self.draft_s - self.verify_s - self.untimed_s

    @property
    def tokens_per_s(self) -> float:
        """Emitted tokens over decode time (prefill excluded)."""
        return self.emitted / (self.wall_s - self.prefill_s - self.untimed_s)

    @property
    def steady_tokens_per_s(self) -> float:
        """Throughput while the whole batch is generating: a static batch's tail, where finished
        sequences idle until the slowest one is done, is left out (continuous batching refills
        those slots); this is what the B·τ/R of docs/design.md §2 describes."""
        return self.steady_tokens / self.steady_s if self.steady_s else float("nan")

    @property
    def steady_round_s(self) -> float:
        """Seconds per round while the whole batch is generating: the R(k, B, L) of docs/design.md
        §2 as measured (T(1, B, L) in plain decoding)."""
        return self.steady_s / self.steady_rounds if self.steady_rounds else float("nan")

    def as_row(self) -> dict:
        c = self.counters
        return dict(k=self.k, drafts=c.drafts, draft_tokens=c.draft_tokens, accepted=c.accepted_tokens,
                    rounds=self.rounds, emitted=self.emitted, wall_s=self.wall_s, prefill_s=self.prefill_s,
                    draft_s=self.draft_s, verify_s=self.verify_s, overhead_s=self.overhead_s, untimed_s=self.untimed_s,
                    tau=c.mean_acceptance_length(), acceptance_rate=c.acceptance_rate(),
                    tokens_per_s=self.tokens_per_s, steady_tokens_per_s=self.steady_tokens_per_s,
                    accepted_per_pos=" ".join(map(str, c.accepted_per_pos)))


class Drafter(Protocol):
    name: str
    needs_hidden: bool

    def prefill(self, st: "DecodeState", hidden: torch.Tensor | None) -> None: ...

    def propose(self, st: "DecodeState", k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Drafts [B, k] and, when sampling, their probabilities q [B, k, V]."""
        ...

    # optional: before_round(st, k), called each round outside every timed phase

    def observe(self, st: "DecodeState", n_acc: torch.Tensor, emitted: torch.Tensor,
                hidden: torch.Tensor | None, start: torch.Tensor) -> None:
        """After a verification at positions start..start+k: what was accepted."""
        ...


@dataclass
class DecodeState:
    """seqs[b] = prompt + emitted tokens; its last token is pending (not yet in the cache);
    lengths[b] = tokens in the target cache = len(seqs[b]) - 1."""
    seqs: list[list[int]]
    prompt_lens: list[int]
    lengths: torch.Tensor
    active: torch.Tensor
    settings: DecodeSettings
    generator: torch.Generator
    device: torch.device

    @property
    def B(self) -> int:
        return len(self.seqs)

    @property
    def pending(self) -> torch.Tensor:
        return torch.tensor([s[-1] for s in self.seqs], device=self.device)

    def generated(self, b: int) -> list[int]:
        return self.seqs[b][self.prompt_lens[b]:]

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return probs_from_logits(logits, self.settings.temperature, self.settings.top_p)

    def pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A token per row of logits [B, V]: argmax, or a sample (returned with its q)."""
        return pick(logits, self.settings.temperature, self.settings.top_p, self.generator)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Phase:
    """Wall time of a phase, device work included (syncs at the boundaries)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        _sync(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        _sync(self.device)
        self.s = time.perf_counter() - self.t0


class SpecEngine:
    def __init__(self, target: Transformer, drafter: Drafter | None = None):
        if target.cfg.full_attention_interval:
            raise ConfigError(f"model {target.cfg.name!r}: its Gated DeltaNet layers keep a recurrent state that "
                              "takes every token it is fed, so a rejected draft cannot be rolled back by position "
                              "(engines checkpoint the state per draft token; this engine does not)")
        self.target, self.drafter = target, drafter
        self.device = target.embed.weight.device

    def _start(self, prompts: list[list[int]], s: DecodeSettings) -> tuple[DecodeState, torch.Tensor | None]:
        B, P = len(prompts), max(len(p) for p in prompts)
        if B > self.target.max_batch or P + s.max_new + 2 * s.k + 1 > self.target.max_context:
            raise ConfigError(f"batch {B} / prompt {P} + max_new {s.max_new} + 2k {2 * s.k} + 1 exceed the cache "
                             f"(max_batch={self.target.max_batch}, max_context={self.target.max_context})")
        if min(len(p) for p in prompts) < 1:
            raise ConfigError("every prompt needs at least one token")
        self.target.reset_cache()
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        padded = torch.tensor([p + [p[-1]] * (P - len(p)) for p in prompts], device=self.device)
        gen = torch.Generator(device=self.device).manual_seed(s.seed)
        st = DecodeState(seqs=[list(p) for p in prompts], prompt_lens=[len(p) for p in prompts], lengths=lens.clone(),
                         active=torch.ones(B, dtype=torch.bool, device=self.device), settings=s, generator=gen,
                         device=self.device)
        # ragged prompts share one padded forward: positions past a prompt's end are masked for
        # its own later queries until real tokens overwrite them
        need_hidden = self.drafter is not None and self.drafter.needs_hidden and s.k > 0
        out = self.target(padded, torch.zeros(B, dtype=torch.long, device=self.device), return_hidden=need_hidden)
        logits, hidden = out if need_hidden else (out, None)
        last = logits[torch.arange(B, device=self.device), lens - 1]
        tok, _ = st.pick(last)
        self._append(st, [[t] for t in tok.tolist()])
        return st, hidden

    def _append(self, st: DecodeState, new: list[list[int]]) -> None:
        s = st.settings
        for b, toks in enumerate(new):
            if not st.active[b]:
                continue
            room = s.max_new - len(st.generated(b))
            toks = toks[:room]
            if s.eos is not None and s.eos in toks:
                toks = toks[:toks.index(s.eos) + 1]
            st.seqs[b].extend(toks)
            if len(st.generated(b)) >= s.max_new or (s.eos is not None and toks and toks[-1] == s.eos):
                st.active[b] = False

    def generate(self, prompts: list[list[int]], settings: DecodeSettings) -> tuple[list[list[int]], SpecMetrics]:
        """Generated tokens per sequence (prompt excluded) and the run's metrics."""
        s = settings
        m = SpecMetrics(k=s.k, counters=AcceptanceCounters(accepted_per_pos=(0,) * s.k))
        if s.k and self.drafter is None:
            raise ValueError("k > 0 needs a drafter")
        with torch.inference_mode(), Phase(self.device) as wall:
            with Phase(self.device) as pre:
                st, hidden = self._start(prompts, s)
                if s.k:
                    self.drafter.prefill(st, hidden)
            m.prefill_s = pre.s
            while st.active.any():
                before = sum(len(q) for q in st.seqs)
                full = bool(st.active.all())
                if s.k:
                    self.before_round(st, m)
                with Phase(self.device) as rnd:
                    if s.k == 0:
                        self._plain_step(st, m)
                    else:
                        self._round(st, m)
                if full and st.active.all():
                    m.steady_s += rnd.s
                    m.steady_rounds += 1
                    m.steady_tokens += sum(len(q) for q in st.seqs) - before
                m.rounds += 1
        m.wall_s = wall.s
        m.emitted = sum(len(st.generated(b)) - 1 for b in range(st.B))  # the first token came from prefill
        return [st.generated(b) for b in range(st.B)], m

    def before_round(self, st: DecodeState, m: SpecMetrics) -> None:
        """The drafter's untimed per-round set-up, if it has one (kept out of every rate)."""
        hook = getattr(self.drafter, "before_round", None)
        if hook is not None:
            with Phase(self.device) as ph:
                hook(st, st.settings.k)
            m.untimed_s += ph.s

    def _plain_step(self, st: DecodeState, m: SpecMetrics) -> None:
        with Phase(self.device) as ph:
            logits = self.target(st.pending[:, None], st.lengths)[:, -1]
        m.verify_s += ph.s
        tok, _ = st.pick(logits)
        st.lengths = st.lengths + st.active.long()
        self._append(st, [[t] for t in tok.tolist()])

    def _round(self, st: DecodeState, m: SpecMetrics) -> None:
        s, k = st.settings, st.settings.k
        with Phase(self.device) as ph:
            drafts, q = self.drafter.propose(st, k)
        m.draft_s += ph.s
        start = st.lengths
        with Phase(self.device) as ph:
            tokens = torch.cat((st.pending[:, None], drafts), dim=1)
            out = self.target(tokens, start, return_hidden=self.drafter.needs_hidden)
        m.verify_s += ph.s
        logits, hidden = out if self.drafter.needs_hidden else (out, None)
        if s.greedy:
            n_acc, emitted = greedy_accept(drafts, logits)
        else:
            n_acc, emitted = sample_accept(drafts, q, st.probs(logits), st.generator)
        act = st.active
        n = int(act.sum())
        m.counters += AcceptanceCounters(drafts=n, draft_tokens=k * n, accepted_tokens=int(n_acc[act].sum()),
                                         accepted_per_pos=tuple(int(((n_acc > i) & act).sum()) for i in range(k)))
        self.drafter.observe(st, n_acc, emitted, hidden, start)
        st.lengths = torch.where(act, start + n_acc + 1, start)
        rows = emitted.tolist()
        self._append(st, [row[:n + 1] for row, n in zip(rows, n_acc.tolist())])
