"""The speculative decoding engine is exact and its drafters do what they say."""

import math

import pytest
import torch

from roofline.spec.drafters import DraftModelDrafter, MTPDrafter, NgramDrafter, OracleDrafter
from roofline.model.decoder import build_model
from roofline.model.presets import get_preset
from roofline.spec.engine import DecodeSettings, SpecEngine, SpecMetrics

CFG = get_preset("tiny")


def target(seed=1, B=4):
    return build_model(CFG, max_batch=B, max_context=160, seed=seed)


def prompts(seed, lens=(5, 9, 3, 7)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CFG.vocab, (n,), generator=g).tolist() for n in lens]


def drafters(t, ref, name):
    if name == "mtp":
        return MTPDrafter(t)
    if name == "ngram":
        return NgramDrafter(CFG.vocab)
    if name == "draft_model":
        return DraftModelDrafter(build_model(CFG.scaled(layers=1), max_batch=4, max_context=160, seed=9), CFG.vocab)
    return OracleDrafter(t, 0.6, CFG.vocab, inner=MTPDrafter(t), seed=3)


@pytest.mark.parametrize("name", ["mtp", "ngram", "draft_model", "oracle"])
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.slow
def test_greedy_speculative_output_equals_plain_greedy(name, B, seed, k):
    t = target(seed)
    ps = prompts(seed)[:B]
    plain, _ = SpecEngine(t).generate(ps, DecodeSettings(max_new=24))
    ref = [p + o for p, o in zip(ps, plain)]
    spec, m = SpecEngine(t, drafters(t, ref, name)).generate(ps, DecodeSettings(max_new=24, k=k))
    assert spec == plain
    assert all(len(o) == 24 for o in spec)


def test_acceptance_is_ragged_across_the_batch():
    t = target(0)
    ps = prompts(0)
    d = OracleDrafter(t, 0.5, CFG.vocab, seed=1)
    engine = SpecEngine(t, d)
    st, hidden = engine._start(ps, DecodeSettings(max_new=30, k=4))
    d.prefill(st, hidden)
    m = SpecMetrics(k=4)
    for _ in range(2):
        engine.before_round(st, m)
        engine._round(st, m)
    assert len(set(st.lengths.tolist())) > 1  # sequences advanced by different amounts
    assert st.lengths.tolist() == [len(s) - 1 for s in st.seqs]


def test_a_draft_model_identical_to_the_target_is_always_accepted():
    t = target(4)
    same = build_model(CFG, max_batch=4, max_context=160, seed=4)
    ps = prompts(4)
    out, m = SpecEngine(t, DraftModelDrafter(same, CFG.vocab)).generate(ps, DecodeSettings(max_new=25, k=4))
    assert m.counters.acceptance_rate() == 1.0
    assert m.counters.mean_acceptance_length() == 5.0


def test_mtp_drafts_equal_a_from_scratch_recomputation():
    """After ragged rounds, the MTP drafter's next draft equals the MTP module run over the
    whole sequence from an empty cache (its catch-up and cache bookkeeping are right)."""
    t = target(5)
    ps = prompts(5)
    mtp = MTPDrafter(t)
    oracle = OracleDrafter(t, 0.6, CFG.vocab, inner=mtp, seed=2)
    engine = SpecEngine(t, oracle)
    st, hidden = engine._start(ps, DecodeSettings(max_new=30, k=3))
    oracle.prefill(st, hidden)
    m = SpecMetrics(k=3)
    for _ in range(3):
        engine.before_round(st, m)
        engine._round(st, m)
    drafts, _ = mtp.propose(st, 3)
    fresh = build_model(CFG, max_batch=1, max_context=160, seed=5)
    for b, seq in enumerate(st.seqs):
        x = torch.tensor([seq[:-1]])
        _, h = fresh(x, torch.zeros(1, dtype=torch.long), return_hidden=True)
        logits, h2 = fresh.mtp_forward(h, torch.tensor([seq[1:]]), torch.zeros(1, dtype=torch.long))
        assert logits[0, -1].argmax().item() == drafts[b, 0].item()
        chained, _ = fresh.mtp_forward(h2[:, -1:], drafts[b:b + 1, :1], torch.tensor([len(seq) - 1]))
        assert chained[0, -1].argmax().item() == drafts[b, 1].item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("alpha", [0.5, 0.9])
def test_oracle_delivers_alpha_at_every_position_in_any_precision(dtype, alpha):
    """Delivered conditional acceptance at each position within 4 binomial standard errors of
    the requested alpha. In bf16 the verification's argmax can differ from a one-token
    decode's at a near-tie; an oracle that drafts from any other computation than the
    verification's own falls short of alpha there (a reference continuation: for the rest of
    the sequence)."""
    t = build_model(CFG, max_batch=16, max_context=200, seed=6, dtype=dtype)
    ps = [prompts(s, (4,))[0] for s in range(16)]
    d = OracleDrafter(t, alpha, CFG.vocab, inner=MTPDrafter(t), seed=7)
    _, m = SpecEngine(t, d).generate(ps, DecodeSettings(max_new=80, k=3))
    c = m.counters
    reached = (c.drafts,) + c.accepted_per_pos[:-1]
    for a_hat, n in zip(c.per_position_alpha(), reached):
        assert n >= 50, "test set-up: position too rarely reached"
        assert abs(a_hat - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n), (a_hat, n)


def test_oracle_shadow_passes_are_not_in_any_timed_phase(monkeypatch):
    """A fake clock that only the shadow passes advance: draft, verify and overhead see none
    of it and the rates are unchanged; untimed_s holds all of it."""
    import roofline.spec.engine as engine_mod
    clock = {"now": 0.0}
    monkeypatch.setattr(engine_mod.time, "perf_counter", lambda: clock["now"])
    t = target(3)
    d = OracleDrafter(t, 0.7, CFG.vocab, seed=4)
    shadow = d.before_round

    def slow_shadow(st, k):
        clock["now"] += 100.0
        shadow(st, k)

    d.before_round = slow_shadow
    _, m = SpecEngine(t, d).generate(prompts(3), DecodeSettings(max_new=12, k=2))
    assert m.rounds > 1
    assert m.untimed_s == 100.0 * m.rounds and m.wall_s == 100.0 * m.rounds
    assert m.draft_s == m.verify_s == m.overhead_s == m.steady_s == 0.0


def test_sampling_with_identical_draft_accepts_everything_and_stops_at_max_new():
    t = target(8)
    same = build_model(CFG, max_batch=4, max_context=160, seed=8)
    s = DecodeSettings(max_new=17, k=3, temperature=1.0, top_p=0.95, seed=3)
    out, m = SpecEngine(t, DraftModelDrafter(same, CFG.vocab)).generate(prompts(8), s)
    assert m.counters.acceptance_rate() > 0.99  # p = q: min(1, p/q) = 1 (up to float rounding)
    assert all(len(o) == 17 for o in out)


def test_eos_stops_each_sequence_on_its_own():
    t = target(1)
    ps = prompts(1)
    plain, _ = SpecEngine(t).generate(ps, DecodeSettings(max_new=20))
    eos = plain[0][5]
    out, _ = SpecEngine(t, NgramDrafter(CFG.vocab)).generate(ps, DecodeSettings(max_new=20, k=2, eos=eos))
    for o, p in zip(out, plain):
        cut = p[:p.index(eos) + 1] if eos in p else p
        assert o == cut


def test_metrics_split_round_time(monkeypatch):
    """Each phase is charged to its own bucket: a fake clock advanced by 1 s in every draft,
    10 s in every target forward; nothing else moves it, so the overhead is exactly zero."""
    import roofline.spec.engine as engine_mod
    clock = {"now": 0.0}
    monkeypatch.setattr(engine_mod.time, "perf_counter", lambda: clock["now"])
    t = target(2)
    forward = t.forward

    def slow_forward(*a, **kw):
        clock["now"] += 10.0
        return forward(*a, **kw)

    monkeypatch.setattr(t, "forward", slow_forward)
    d = NgramDrafter(CFG.vocab)
    propose = d.propose

    def slow_propose(st, k):
        clock["now"] += 1.0
        return propose(st, k)

    d.propose = slow_propose
    _, m = SpecEngine(t, d).generate(prompts(2), DecodeSettings(max_new=12, k=2))
    assert m.prefill_s == 10.0
    assert m.draft_s == 1.0 * m.rounds and m.verify_s == 10.0 * m.rounds and m.overhead_s == 0.0
    assert m.steady_s % 11.0 == 0 and 0 < m.steady_s <= 11.0 * m.rounds


def test_the_mtp_pass_over_the_prompt_is_prefill_not_the_first_rounds_draft(monkeypatch):
    """Engines run the MTP head over the prompt in the prefill. Done lazily in round 1's draft
    phase it was charged to decoding (a 64-token pass at B=4 is ~16 steps' worth of draft time)."""
    t = target()
    calls = []
    inner = t.mtp_forward
    monkeypatch.setattr(t, "mtp_forward", lambda h, *a, **kw: calls.append(h.shape[1]) or inner(h, *a, **kw))
    ps = prompts(0)
    eng = SpecEngine(t, MTPDrafter(t))
    phases = []
    original_prefill = MTPDrafter.prefill

    def prefill(self, st, hidden):
        original_prefill(self, st, hidden)
        phases.append(list(calls))

    monkeypatch.setattr(MTPDrafter, "prefill", prefill)
    eng.generate(ps, DecodeSettings(max_new=6, k=1))
    assert phases[0] == [max(len(p) for p in ps)]  # one pass over the (padded) prompt, inside prefill
    assert max(calls[1:]) == 2  # every round after it: the k+1 = 2 verified positions only
