"""Drafters for `roofline.spec.engine`, one interface: prefill, propose k, observe the verdict.

- MTPDrafter: the target's own MTP module chained on the target's hidden states, as serving
  engines run DeepSeek-V3's: after each verification one MTP pass over the k+1 verified
  positions (ragged: each sequence reads its draft at its own last accepted position) yields
  draft 1; drafts 2..k chain the module on its own hidden state, one position at a time.
- DraftModelDrafter: a separate small model with its own cache. Each round it re-feeds the
  target's last cached token and the pending one (two tokens: covers the case where all k
  drafts were accepted and the last draft never went through it), then chains k-1 steps.
- NgramDrafter: prompt lookup, ≈ free; proposals shorter than k are padded.
- OracleDrafter: proposes the token the target will pick NOW with probability α
  (independently per position), a wrong one otherwise, while spending the real compute of an
  inner drafter — acceptance under control, timing real. It learns the target's pick from
  the current state each round (a shadow verification outside the timed region, see
  `before_round`), so a near-tie that flips an argmax costs one position, never the rest
  of the sequence, and α is delivered in any precision.
"""

from __future__ import annotations

import torch

from roofline.model.decoder import Transformer
from roofline.spec.ngram import propose as ngram_propose
from roofline.spec.engine import DecodeState
from roofline.io.fields import ConfigError


def chain(st: DecodeState, k: int, logits: torch.Tensor, step) -> tuple[torch.Tensor, torch.Tensor | None]:
    """k drafts: pick from `logits`, then `step(i, previous draft)` gives the next logits."""
    drafts, probs = [], []
    for i in range(k):
        if i:
            logits = step(i, drafts[-1])
        tok, q = st.pick(logits)
        drafts.append(tok)
        probs.append(q)
    return torch.stack(drafts, 1), None if st.settings.greedy else torch.stack(probs, 1)


class MTPDrafter:
    name = "mtp"
    needs_hidden = True

    def __init__(self, target: Transformer, depth: int = 0):
        if not target.mtp:
            raise ConfigError("the target has no MTP module (mtp_layers=0)")
        self.target, self.depth = target, depth
        self._ready = None  # the catch-up pass already run (by prefill), for the next propose

    def prefill(self, st: DecodeState, hidden: torch.Tensor) -> None:
        B, P = hidden.shape[:2]
        nxt = torch.zeros(B, P, dtype=torch.long, device=st.device)
        for b, seq in enumerate(st.seqs):  # token one ahead of each position: x_1 .. x_P
            n = st.prompt_lens[b]
            nxt[b, :n] = torch.tensor(seq[1:n + 1], device=st.device)
        self._pass = (hidden, nxt, torch.zeros(B, dtype=torch.long, device=st.device), st.lengths - 1)
        # the module's pass over the prompt is prefill work (engines run the MTP head in the
        # prefill): done here, inside the prefill phase, not in the first decode round's draft
        self._ready = self._catch_up(st)

    def observe(self, st, n_acc, emitted, hidden, start) -> None:
        nxt = torch.where(emitted >= 0, emitted, emitted[torch.arange(st.B), n_acc][:, None])
        self._pass = (hidden, nxt, start, n_acc)
        self._ready = None

    def _catch_up(self, st: DecodeState):
        """The module over the positions the target verified last (the prompt after prefill):
        logits of draft 1, the module's hidden state at the last position, and that position."""
        hidden, nxt, start, last = self._pass
        rows = torch.arange(st.B, device=st.device)
        logits, h = self.target.mtp_forward(hidden, nxt, start, self.depth)
        return logits[rows, last], h[rows, last], start + last

    def propose(self, st: DecodeState, k: int):
        first, h, pos = self._ready if self._ready is not None else self._catch_up(st)
        self._ready = None
        state = {"h": h}

        def step(i, prev):  # chain the module on its own hidden state, one position further
            lg, state["h"] = self.target.mtp_forward(state["h"][:, None], prev[:, None], pos + i, self.depth)
            state["h"] = state["h"][:, 0]
            return lg[:, 0]

        return chain(st, k, first, step)


class DraftModelDrafter:
    name = "draft_model"
    needs_hidden = False

    def __init__(self, model: Transformer, target_vocab: int):
        if model.cfg.vocab != target_vocab:
            raise ConfigError(f"draft model vocab {model.cfg.vocab} != target vocab {target_vocab}: "
                             "a draft model must share the target's vocabulary")
        self.model = model

    def prefill(self, st: DecodeState, hidden) -> None:
        self.model.reset_cache()
        P = max(st.prompt_lens)
        padded = torch.tensor([s[:n] + [s[n - 1]] * (P - n) for s, n in zip(st.seqs, st.prompt_lens)],
                              device=st.device)
        self.model(padded, torch.zeros(st.B, dtype=torch.long, device=st.device))

    def observe(self, st, n_acc, emitted, hidden, start) -> None:
        pass

    def propose(self, st: DecodeState, k: int):
        last_cached = torch.tensor([s[-2] for s in st.seqs], device=st.device)
        feed = torch.stack((last_cached, st.pending), 1)
        logits = self.model(feed, st.lengths - 1)[:, -1]
        return chain(st, k, logits, lambda i, prev: self.model(prev[:, None], st.lengths + i)[:, -1])


class NgramDrafter:
    name = "ngram"
    needs_hidden = False

    def __init__(self, vocab: int, max_ngram: int = 3):
        self.vocab, self.max_ngram = vocab, max_ngram

    def prefill(self, st, hidden) -> None:
        pass

    def observe(self, st, n_acc, emitted, hidden, start) -> None:
        pass

    def propose(self, st: DecodeState, k: int):
        rows = []
        for seq in st.seqs:
            p = ngram_propose(seq, k, max_ngram=self.max_ngram)
            rows.append(p + [p[-1] if p else seq[-1]] * (k - len(p)))
        drafts = torch.tensor(rows, device=st.device)
        if st.settings.greedy:
            return drafts, None
        # a deterministic proposal is a one-hot draft distribution: acceptance prob = p(x)
        return drafts, torch.nn.functional.one_hot(drafts, self.vocab).float()


class OracleDrafter:
    """Delivers the requested per-position acceptance α with the real drafter's compute.

    Each round, before the draft phase and outside every timed phase (the engine calls
    `before_round` untimed), it decides hit or miss per position by a coin flip with
    probability α and learns the target's greedy token at each position it needs with
    "shadow" verification passes: the target's forward over [pending, g_1..g_k], the very
    shape, start positions and kernels of the verification that follows, with g_1..g_{p-1}
    already fixed when position p is read. Row p of a forward depends only on tokens <= p
    (causal attention; each matmul row is computed alone for a fixed shape), so the shadow's
    pick is bit for bit the verification's, in bf16 as in float32. A miss proposes a token
    that differs from it. The shadow passes write cache positions that the verification
    overwrites before it reads them. Passes per round: the first miss position (k if none).
    """

    name = "oracle"

    def __init__(self, target: Transformer, alpha: float, vocab: int, inner=None, seed: int = 0):
        if not 0 <= alpha <= 1:
            raise ConfigError(f"alpha={alpha}: must be in [0, 1]")
        self.target, self.alpha, self.vocab, self.inner = target, alpha, vocab, inner
        self.needs_hidden = bool(inner and inner.needs_hidden)
        self.gen = torch.Generator().manual_seed(seed)
        self._drafts = None
        self.shadow_passes = 0

    def prefill(self, st, hidden) -> None:
        if not st.settings.greedy:
            raise ConfigError("the oracle drafter validates greedy decoding (temperature=0)")
        if self.inner:
            self.inner.prefill(st, hidden)

    def observe(self, st, n_acc, emitted, hidden, start) -> None:
        if self.inner:
            self.inner.observe(st, n_acc, emitted, hidden, start)

    def before_round(self, st: DecodeState, k: int) -> None:
        """Untimed: this round's drafts, right with probability α at each position."""
        hit = torch.rand(st.B, k, generator=self.gen) < self.alpha
        offset = torch.randint(1, self.vocab, (st.B, k), generator=self.gen)
        first_miss = torch.where(~hit.all(1), (~hit).float().argmax(1), torch.full((st.B,), k - 1))
        tokens = st.pending[:, None].repeat(1, k + 1)
        for p in range(int(first_miss.max()) + 1):  # position p+1 needs p fixed drafts before it
            right = self.target(tokens, st.lengths)[:, p].argmax(-1).cpu()
            tokens[:, p + 1] = torch.where(hit[:, p], right, (right + offset[:, p]) % self.vocab).to(tokens.device)
            self.shadow_passes += 1
        self._drafts = tokens[:, 1:]

    def propose(self, st: DecodeState, k: int):
        if self.inner:
            self.inner.propose(st, k)  # the real drafter's compute; its tokens are replaced
        if self._drafts is None or self._drafts.shape[1] != k:
            raise RuntimeError("OracleDrafter.propose before before_round (the engine calls it each round)")
        drafts, self._drafts = self._drafts, None
        return drafts, None
