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
    return OracleDrafter(ref, 0.6, CFG.vocab, inner=MTPDrafter(t), seed=3)


@pytest.mark.parametrize("name", ["mtp", "ngram", "draft_model", "oracle"])
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k", [1, 3])
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
    plain, _ = SpecEngine(t).generate(ps, DecodeSettings(max_new=30))
    d = OracleDrafter([p + o for p, o in zip(ps, plain)], 0.5, CFG.vocab, seed=1)
    engine = SpecEngine(t, d)
    st, hidden = engine._start(ps, DecodeSettings(max_new=30, k=4))
    d.prefill(st, hidden)
    m = SpecMetrics(k=4)
    engine._round(st, m)
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
    plain, _ = SpecEngine(t).generate(ps, DecodeSettings(max_new=30))
    mtp = MTPDrafter(t)
    oracle = OracleDrafter([p + o for p, o in zip(ps, plain)], 0.6, CFG.vocab, inner=mtp, seed=2)
    engine = SpecEngine(t, oracle)
    st, hidden = engine._start(ps, DecodeSettings(max_new=30, k=3))
    oracle.prefill(st, hidden)
    m = SpecMetrics(k=3)
    for _ in range(3):
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


def test_oracle_acceptance_matches_alpha_within_sampling_error():
    t = build_model(CFG, max_batch=16, max_context=200, seed=6)
    ps = [prompts(s, (4,))[0] for s in range(16)]
    plain, _ = SpecEngine(t).generate(ps, DecodeSettings(max_new=80))
    alpha = 0.7
    d = OracleDrafter([p + o for p, o in zip(ps, plain)], alpha, CFG.vocab, seed=7)
    _, m = SpecEngine(t, d).generate(ps, DecodeSettings(max_new=80, k=3))
    c = m.counters
    reached = (c.drafts,) + c.accepted_per_pos[:-1]
    for a_hat, n in zip(c.per_position_alpha(), reached):
        assert abs(a_hat - alpha) < 4 * math.sqrt(alpha * (1 - alpha) / n), (a_hat, n)


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


def test_metrics_split_round_time():
    t = target(2)
    _, m = SpecEngine(t, MTPDrafter(t)).generate(prompts(2), DecodeSettings(max_new=12, k=2))
    assert m.draft_s > 0 and m.verify_s > 0 and m.overhead_s >= 0
    assert m.wall_s == pytest.approx(m.prefill_s + m.draft_s + m.verify_s + m.overhead_s)
    assert m.counters.draft_tokens == 2 * m.counters.drafts
    assert 0 < m.steady_s <= m.wall_s and 0 < m.steady_tokens <= m.emitted + 4
