"""Speculative-decoding verification: which drafted tokens the target keeps.

A drafter proposes k tokens; the target scores all of them in one forward pass of k+1
positions and keeps the longest acceptable prefix plus one token of its own, so every
round emits between 1 and k+1 tokens. Both rules here are exact: the emitted stream has
the target's distribution, whatever the drafter proposes.

- Greedy: keep drafts while they equal the target's argmax; the first mismatch is
  replaced by the target's argmax (and if all k match, the argmax at position k+1 is a
  free bonus token).
- Sampling (Leviathan et al. 2023, Chen et al. 2023): draft x_i ~ q_i is kept with
  probability min(1, p_i(x)/q_i(x)); at the first rejection the replacement is drawn from
  norm(max(0, p_i - q_i)), the part of p that q under-proposes; if all k are kept, a bonus
  token is drawn from p_{k+1}. Acceptance per position is sum_x min(p_i(x), q_i(x)).

Everything is batched over B sequences with no Python loop over B or k, and every random
draw comes from the caller's torch.Generator, so a round is reproducible from its seed.
Outputs use -1 as padding past the emitted length n_accepted + 1.
"""

from __future__ import annotations

import torch

from roofline.io.fields import ConfigError

PAD = -1


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """Sampling distribution over the last axis, computed the same way for target and drafter.

    temperature 0 means greedy: a one-hot at the argmax (first index on ties). Otherwise
    softmax(logits / temperature), restricted to the nucleus (the smallest set of most
    probable tokens whose mass reaches top_p) and renormalised. The acceptance rule is only
    exact for the p and q actually used, so both sides must go through this function.
    """
    if not temperature >= 0.0:
        raise ConfigError(f"temperature must be >= 0, got {temperature!r}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p!r}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    if temperature == 0.0:
        probs = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
        return probs.scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    probs = torch.softmax(logits.to(dtype) / temperature, dim=-1)
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    # A token is in the nucleus if the more probable tokens have not yet reached top_p;
    # the most probable token is always kept.
    keep_sorted = mass_before < top_p
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    probs = probs * keep
    return probs / probs.sum(-1, keepdim=True)


def pick(logits: torch.Tensor, temperature: float, top_p: float,
         generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A token per row of logits [B, V]: the argmax (temperature 0), or a sample from
    probs_from_logits, returned with that distribution q (what the acceptance rule needs)."""
    if temperature == 0:
        return logits.argmax(-1), None
    q = probs_from_logits(logits, temperature, top_p)
    return torch.multinomial(q, 1, generator=generator)[:, 0], q


def _check_shapes(draft_tokens: torch.Tensor, target: torch.Tensor, draft: torch.Tensor | None = None) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, k], got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.dtype != torch.long:
        raise ValueError(f"draft_tokens must be torch.long, got {draft_tokens.dtype}")
    batch, k = draft_tokens.shape
    if target.dim() != 3 or target.shape[:2] != (batch, k + 1):
        raise ValueError(f"target must be [B, k+1, V] = [{batch}, {k + 1}, V], got shape {tuple(target.shape)}")
    if draft is not None and draft.shape != (batch, k, target.shape[2]):
        raise ValueError(
            f"draft_probs must be [B, k, V] = [{batch}, {k}, {target.shape[2]}], got shape {tuple(draft.shape)}"
        )


def _emit(draft_tokens: torch.Tensor, n_accepted: torch.Tensor, last_token: torch.Tensor) -> torch.Tensor:
    """[B, k+1]: the n accepted drafts, then last_token, then PAD."""
    batch, k = draft_tokens.shape
    emitted = torch.cat([draft_tokens, draft_tokens.new_full((batch, 1), PAD)], dim=1)
    emitted.scatter_(1, n_accepted[:, None], last_token[:, None])
    position = torch.arange(k + 1, device=draft_tokens.device)
    return emitted.masked_fill_(position[None, :] > n_accepted[:, None], PAD)


def _accepted_prefix(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True per row: [B, k] bool -> [B] long."""
    return accepted.long().cumprod(dim=1).sum(dim=1)


def greedy_accept(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: keep drafts while they equal the target's argmax.

    draft_tokens [B, k] long; target_logits [B, k+1, V], where position i scores the token
    that follows draft i-1 (position 0 follows the context). Returns n_accepted [B] and
    emitted [B, k+1]: emitted[b, :n+1] is the target's own greedy continuation (the kept
    drafts equal it by definition), emitted[b, n+1:] is -1.
    """
    _check_shapes(draft_tokens, target_logits)
    target_tokens = target_logits.argmax(dim=-1)
    n_accepted = _accepted_prefix(draft_tokens == target_tokens[:, :-1])
    last_token = target_tokens.gather(1, n_accepted[:, None]).squeeze(1)
    return n_accepted, _emit(draft_tokens, n_accepted, last_token)


def sample_accept(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact speculative sampling for a chain of k drafts, batched over B.

    draft_tokens [B, k] were drawn from draft_probs q [B, k, V]; target_probs p is
    [B, k+1, V]. Draft i is kept with probability min(1, p_i(x)/q_i(x)), i.e. when
    u * q_i(x) < p_i(x) for u ~ U[0, 1); the first rejected position i draws its token from
    norm(max(0, p_i - q_i)); if all k are kept, position k draws a bonus token from p_k.
    The k uniforms are drawn for every position at once: draws past the first rejection are
    independent of everything emitted and are simply unused.

    max(0, p_i - q_i) is all zero only where p_i <= q_i everywhere, i.e. p_i == q_i, where
    a rejection cannot happen; rows where it is zero (including those never rejected) fall
    back to p_i so that the single batched categorical draw stays well defined.
    Returns n_accepted [B] long and emitted [B, k+1] long padded with -1.
    """
    _check_shapes(draft_tokens, target_probs, draft_probs)
    batch, k = draft_tokens.shape
    dtype = torch.promote_types(draft_probs.dtype, target_probs.dtype)
    p = target_probs.to(dtype)
    q = draft_probs.to(dtype)

    p_draft = p[:, :k].gather(2, draft_tokens[:, :, None]).squeeze(2)
    q_draft = q.gather(2, draft_tokens[:, :, None]).squeeze(2)
    u = torch.rand((batch, k), generator=generator, dtype=dtype, device=p.device)
    n_accepted = _accepted_prefix(u * q_draft < p_draft)

    # At position n the token comes from the residual (n < k) or from p itself (n == k):
    # padding q with a zero row at position k turns the bonus draw into a residual draw.
    q_padded = torch.cat([q, q.new_zeros((batch, 1, q.shape[2]))], dim=1)
    rows = torch.arange(batch, device=p.device)
    p_n = p[rows, n_accepted]
    residual = (p_n - q_padded[rows, n_accepted]).clamp_min_(0.0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    last_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return n_accepted, _emit(draft_tokens, n_accepted, last_token)
