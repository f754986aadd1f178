"""Verification rules of speculative decoding: greedy and sampling, both exact.

The sampling rule is tested the way docs/design.md §5 asks: with a context-free target (p_j at
position j does not depend on the tokens before it), the token emitted at position j,
among rounds that reach position j, must be distributed as p_j. A chi-square goodness-of-fit
test checks that at every position, the bonus token included, for a generic pair and for
adversarial pairs; two deliberately broken rules (defined here, not in the library) must
fail the same test.
"""

import math

import pytest
import torch
from scipy.stats import chisquare

from roofline.spec.verify import PAD, greedy_accept, probs_from_logits, sample_accept

K = 3
V = 6
ROUNDS = 40_000
PASS_P = 1e-3  # the correct rule: every position's p-value above this
FAIL_P = 1e-6  # a broken rule: some position's p-value below this
MIN_REACH = 100  # a position tested must be reached this often in expectation


# --- deliberately wrong rules -------------------------------------------------------------


def accept_always(draft_tokens, draft_probs, target_probs, generator):
    """Keeps every draft: the output follows q, not p."""
    batch, k = draft_tokens.shape
    bonus = torch.multinomial(target_probs[:, k], 1, generator=generator)
    return torch.full((batch,), k, dtype=torch.long), torch.cat([draft_tokens, bonus], dim=1)


def resample_from_target(draft_tokens, draft_probs, target_probs, generator):
    """Right acceptance test, wrong replacement: a rejected position is redrawn from p_i,
    not from norm(max(0, p_i - q_i)), which over-weights tokens q already proposes."""
    batch, k = draft_tokens.shape
    p_draft = target_probs[:, :k].gather(2, draft_tokens[:, :, None]).squeeze(2)
    q_draft = draft_probs.gather(2, draft_tokens[:, :, None]).squeeze(2)
    u = torch.rand((batch, k), generator=generator, dtype=target_probs.dtype)
    n_accepted = (u * q_draft < p_draft).long().cumprod(dim=1).sum(dim=1)
    rows = torch.arange(batch)
    last = torch.multinomial(target_probs[rows, n_accepted], 1, generator=generator).squeeze(1)
    emitted = torch.cat([draft_tokens, torch.full((batch, 1), PAD)], dim=1)
    emitted[rows, n_accepted] = last
    emitted[torch.arange(k + 1)[None, :] > n_accepted[:, None]] = PAD
    return n_accepted, emitted


# --- context-free target and drafter --------------------------------------------------------


def _random_dist(shape, gen):
    """Probabilities bounded away from zero, so every cell of the chi-square test is populated."""
    weights = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.1
    return weights / weights.sum(-1, keepdim=True)


def _one_hot(tokens):
    return torch.nn.functional.one_hot(tokens, V).to(torch.float64)


def _case(name, seed):
    """(p [K+1, V], q [K, V]) for one named pair; p_j and q_j differ by position."""
    gen = torch.Generator().manual_seed(seed)
    if name == "generic":
        return _random_dist((K + 1, V), gen), _random_dist((K, V), gen)
    if name == "p_equals_q":
        p = _random_dist((K + 1, V), gen)
        return p, p[:K].clone()
    if name == "disjoint":
        half = V // 2
        p = torch.zeros(K + 1, V, dtype=torch.float64)
        q = torch.zeros(K, V, dtype=torch.float64)
        p[:, half:] = _random_dist((K + 1, V - half), gen)
        q[:, :half] = _random_dist((K, half), gen)
        return p, q
    if name == "one_hot_q":
        drafted = torch.randint(0, V, (K,), generator=gen)
        p = _random_dist((K + 1, V), gen)
        # Give the drafted token real target mass so later positions are reached often.
        p[torch.arange(K), drafted] += 1.0
        return p / p.sum(-1, keepdim=True), _one_hot(drafted)
    if name == "one_hot_p":
        targets = torch.randint(0, V, (K + 1,), generator=gen)
        q = _random_dist((K, V), gen)
        # Give the target token real draft mass so later positions are reached often.
        q[torch.arange(K), targets[:K]] += 1.0
        return _one_hot(targets), q / q.sum(-1, keepdim=True)
    raise ValueError(name)


CASES = ["generic", "p_equals_q", "disjoint", "one_hot_q", "one_hot_p"]


def _play(rule, p, q, rounds, seed):
    """`rounds` independent speculative rounds as one batch, drafts drawn from q."""
    gen = torch.Generator().manual_seed(seed)
    q_batch = q.expand(rounds, K, V)
    drafts = torch.multinomial(q_batch.reshape(-1, V), 1, generator=gen).view(rounds, K)
    return rule(drafts, q_batch, p.expand(rounds, K + 1, V), gen)


def _reach_probability(p, q):
    """s_j = P(emitted length > j) = prod_{i<j} sum_x min(p_i(x), q_i(x)), j = 0..K."""
    alpha = torch.minimum(p[:K], q).sum(-1)
    return torch.cat([torch.ones(1, dtype=torch.float64), alpha.cumprod(0)])


def _gof_pvalue(tokens, expected):
    """Chi-square p-value of observed tokens against `expected`; a token outside its support
    is an outright failure, and a one-token support passes iff nothing else was seen."""
    counts = torch.bincount(tokens, minlength=V).to(torch.float64)
    support = expected > 0
    if counts[~support].sum() > 0:
        return 0.0
    if int(support.sum()) < 2:
        return 1.0
    f_exp = expected[support] / expected[support].sum() * counts.sum()
    return float(chisquare(counts[support].numpy(), f_exp.numpy()).pvalue)


def _position_pvalues(rule, p, q, seed):
    """p-value per output position j = 0..K among rounds that reached j; None if unreachable."""
    n_accepted, emitted = _play(rule, p, q, ROUNDS, seed)
    reach = _reach_probability(p, q)
    pvalues = []
    for j in range(K + 1):
        reached = n_accepted >= j
        if reach[j] == 0:
            assert not reached.any(), f"position {j} is unreachable but was reached"
            pvalues.append(None)
            continue
        assert ROUNDS * reach[j] >= MIN_REACH, f"test set-up: position {j} too rarely reached"
        pvalues.append(_gof_pvalue(emitted[reached, j], p[j]))
    return pvalues


# --- sampling rule: exactness ---------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_sampling_rule_emits_the_target_distribution_at_every_position(case):
    p, q = _case(case, seed=101)
    pvalues = _position_pvalues(sample_accept, p, q, seed=202)
    assert pvalues[0] is not None
    tested = [pv for pv in pvalues if pv is not None]
    assert min(tested) > PASS_P, f"{case}: p-values per position {pvalues}"


@pytest.mark.parametrize("wrong_rule", [accept_always, resample_from_target])
def test_broken_rule_fails_the_same_test(wrong_rule):
    p, q = _case("generic", seed=101)
    pvalues = _position_pvalues(wrong_rule, p, q, seed=202)
    assert min(pv for pv in pvalues if pv is not None) < FAIL_P, f"p-values per position {pvalues}"


def test_acceptance_rate_per_position_is_overlap_of_p_and_q():
    p, q = _case("generic", seed=303)
    n_accepted, _ = _play(sample_accept, p, q, ROUNDS, seed=404)
    alpha = torch.minimum(p[:K], q).sum(-1)
    for j in range(K):
        reached = int((n_accepted >= j).sum())
        accepted = int((n_accepted >= j + 1).sum())
        a = float(alpha[j])
        five_sigma = 5 * math.sqrt(a * (1 - a) / reached)
        assert abs(accepted / reached - a) < five_sigma, f"position {j}: {accepted}/{reached} vs {a:.4f}"


def test_p_equals_q_accepts_every_draft():
    p, q = _case("p_equals_q", seed=505)
    n_accepted, emitted = _play(sample_accept, p, q, 2_000, seed=606)
    assert bool((n_accepted == K).all())
    assert bool((emitted >= 0).all())


def test_disjoint_supports_reject_the_first_draft():
    p, q = _case("disjoint", seed=505)
    n_accepted, emitted = _play(sample_accept, p, q, 2_000, seed=606)
    assert bool((n_accepted == 0).all())
    assert bool((emitted[:, 1:] == PAD).all())


# --- sampling rule: mechanics ---------------------------------------------------------------


def test_sampling_output_layout_is_accepted_drafts_then_one_token_then_padding():
    p, q = _case("generic", seed=707)
    gen = torch.Generator().manual_seed(808)
    drafts = torch.multinomial(q.repeat(500, 1), 1, generator=gen).view(500, K)
    n_accepted, emitted = sample_accept(drafts, q.expand(500, K, V), p.expand(500, K + 1, V), gen)
    position = torch.arange(K + 1)[None, :]
    kept = position < n_accepted[:, None]
    assert emitted.dtype == torch.long and n_accepted.dtype == torch.long
    assert bool((emitted[:, :K][kept[:, :K]] == drafts[kept[:, :K]]).all())
    assert bool((emitted.gather(1, n_accepted[:, None]) >= 0).all())
    assert bool((emitted[position > n_accepted[:, None]] == PAD).all())
    assert len(set(n_accepted.tolist())) > 1, "set-up: acceptance should be ragged"


def test_sampling_uses_only_the_given_generator():
    p, q = _case("generic", seed=909)
    drafts = torch.multinomial(q.repeat(256, 1), 1, generator=torch.Generator().manual_seed(1)).view(256, K)
    args = (drafts, q.expand(256, K, V), p.expand(256, K + 1, V))
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    first = sample_accept(*args, torch.Generator().manual_seed(42))
    assert torch.equal(torch.get_rng_state(), global_state)
    torch.manual_seed(12345)
    second = sample_accept(*args, torch.Generator().manual_seed(42))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


def test_sampling_at_temperature_zero_is_greedy():
    gen = torch.Generator().manual_seed(1111)
    batch, k, vocab = 64, 4, 3  # a tiny vocabulary makes chance agreement, hence ragged acceptance
    target_logits = torch.randn(batch, k + 1, vocab, generator=gen)
    draft_logits = torch.randn(batch, k, vocab, generator=gen)
    q = probs_from_logits(draft_logits, temperature=0.0, top_p=1.0)
    p = probs_from_logits(target_logits, temperature=0.0, top_p=1.0)
    drafts = draft_logits.argmax(-1)
    n_sample, emitted_sample = sample_accept(drafts, q, p, gen)
    n_greedy, emitted_greedy = greedy_accept(drafts, target_logits)
    assert len(set(n_greedy.tolist())) >= 3, "set-up: acceptance should be ragged"
    assert torch.equal(n_sample, n_greedy)
    assert torch.equal(emitted_sample, emitted_greedy)


def test_sampling_rejects_mismatched_shapes():
    drafts = torch.zeros(2, K, dtype=torch.long)
    with pytest.raises(ValueError, match="draft_probs"):
        sample_accept(drafts, torch.full((2, K + 1, V), 1 / V), torch.full((2, K + 1, V), 1 / V), None)
    with pytest.raises(ValueError, match="target"):
        sample_accept(drafts, torch.full((2, K, V), 1 / V), torch.full((2, K, V), 1 / V), None)


# --- greedy rule ----------------------------------------------------------------------------


def test_greedy_keeps_the_matching_prefix_and_appends_the_target_token():
    target_argmax = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [4, 3, 2, 1], [0, 1, 2, 3]])
    drafts = torch.tensor(
        [
            [0, 2, 3],  # first draft wrong: later matches do not count
            [1, 0, 3],  # one accepted
            [4, 3, 0],  # two accepted
            [0, 1, 2],  # all accepted: the bonus token follows
        ]
    )
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(4, K + 1, 5, generator=gen)
    logits.scatter_(2, target_argmax[:, :, None], 10.0)
    n_accepted, emitted = greedy_accept(drafts, logits)
    assert n_accepted.tolist() == [0, 1, 2, 3]
    assert emitted.tolist() == [
        [1, PAD, PAD, PAD],
        [1, 2, PAD, PAD],
        [4, 3, 2, PAD],
        [0, 1, 2, 3],
    ]


def test_greedy_rejects_a_target_without_the_bonus_position():
    with pytest.raises(ValueError, match="k\\+1"):
        greedy_accept(torch.zeros(2, K, dtype=torch.long), torch.zeros(2, K, V))


# --- probs_from_logits ----------------------------------------------------------------------


def test_temperature_zero_is_one_hot_at_the_argmax():
    logits = torch.randn(4, 7, 11, generator=torch.Generator().manual_seed(1))
    probs = probs_from_logits(logits, temperature=0.0, top_p=0.9)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 11).float())


def test_temperature_divides_the_logits():
    logits = torch.randn(8, 13, generator=torch.Generator().manual_seed(2))
    probs = probs_from_logits(logits, temperature=0.5, top_p=1.0)
    torch.testing.assert_close(probs, torch.softmax(2 * logits, dim=-1), rtol=1e-6, atol=1e-7)


def test_top_p_keeps_the_smallest_most_probable_set_reaching_top_p():
    gen = torch.Generator().manual_seed(3)
    logits = 2 * torch.randn(200, 17, generator=gen, dtype=torch.float64)
    top_ps = torch.rand(200, generator=gen, dtype=torch.float64) * 0.98 + 0.01
    full = torch.softmax(logits, dim=-1)
    for row, top_p in zip(range(200), top_ps.tolist()):
        kept = probs_from_logits(logits[row], temperature=1.0, top_p=top_p) > 0
        mass = full[row][kept].sum()
        assert mass >= top_p
        assert mass - full[row][kept].min() < top_p  # dropping the least probable kept token falls short
        dropped = torch.cat([full[row][~kept], torch.zeros(1, dtype=torch.float64)])
        assert full[row][kept].min() >= dropped.max()  # the most probable tokens


def test_top_p_renormalises_the_nucleus():
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)
    nucleus = probs_from_logits(probs.log(), temperature=1.0, top_p=0.7)
    torch.testing.assert_close(nucleus, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("temperature, top_p", [(0.0, 1.0), (0.7, 1.0), (1.0, 0.5), (1.3, 0.95), (1e-3, 0.2)])
def test_probability_rows_sum_to_one(temperature, top_p):
    logits = 3 * torch.randn(32, 50, generator=torch.Generator().manual_seed(4))
    probs = probs_from_logits(logits, temperature, top_p)
    assert bool((probs >= 0).all())
    torch.testing.assert_close(probs.sum(-1), torch.ones(32), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "temperature, top_p, field", [(-0.1, 1.0, "temperature"), (1.0, 0.0, "top_p"), (1.0, 1.5, "top_p")]
)
def test_bad_sampling_settings_name_the_field(temperature, top_p, field):
    with pytest.raises(ValueError, match=field):
        probs_from_logits(torch.zeros(3), temperature, top_p)
