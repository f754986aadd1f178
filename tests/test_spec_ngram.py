"""N-gram prompt lookup: longest recurring suffix, most recent occurrence, k tokens after it."""

import pytest
import torch

from roofline.spec.ngram import propose


def test_exact_repetition_proposes_the_repeated_continuation():
    context = [5, 6, 7, 8, 9, 5, 6, 7]
    assert propose(context, k=2) == [8, 9]


def test_longest_suffix_wins_over_a_more_recent_shorter_match():
    # Suffix (1, 2, 3) occurs at the start, followed by 40; the 1-gram (3,) occurs more
    # recently, followed by 50. The 3-gram must win.
    context = [1, 2, 3, 40, 9, 3, 50, 1, 2, 3]
    assert propose(context, k=1, max_ngram=3) == [40]
    assert propose(context, k=1, max_ngram=1) == [50]


def test_most_recent_earlier_occurrence_is_used():
    context = [1, 2, 10, 1, 2, 20, 1, 2]
    assert propose(context, k=1, max_ngram=2) == [20]


def test_overlapping_occurrence_counts():
    # The 2-gram (7, 7) occurs at positions 0 and 1; position 1 overlaps the suffix itself.
    assert propose([7, 7, 7], k=3, max_ngram=2) == [7]


def test_no_match_returns_empty_list():
    assert propose([1, 2, 3, 4, 5], k=4) == []
    assert propose([], k=4) == []
    assert propose([3], k=4) == []


def test_suffix_shorter_than_min_ngram_is_not_used():
    # Only the 1-gram (4,) recurs; with min_ngram=2 there is no match.
    assert propose([4, 8, 1, 4], k=2, min_ngram=2) == []
    assert propose([4, 8, 1, 4], k=2, min_ngram=1) == [8, 1]


def test_proposal_is_truncated_at_the_context_end():
    context = [1, 2, 3, 1, 2]
    assert propose(context, k=10, max_ngram=2) == [3, 1, 2]


def test_proposal_respects_k():
    context = [9, 1, 2, 3, 4, 5, 6, 9]
    assert propose(context, k=3, max_ngram=1) == [1, 2, 3]
    assert propose(context, k=0, max_ngram=1) == []


def test_tensor_context_gives_the_same_python_ints():
    context = [5, 6, 7, 8, 9, 5, 6, 7]
    proposal = propose(torch.tensor(context), k=2)
    assert proposal == propose(context, k=2) == [8, 9]
    assert all(type(t) is int for t in proposal)


def test_random_context_matches_a_brute_force_search():
    rng = torch.Generator().manual_seed(1234)
    for _ in range(200):
        length = int(torch.randint(0, 30, (1,), generator=rng))
        context = torch.randint(0, 4, (length,), generator=rng).tolist()
        assert propose(context, k=3, max_ngram=3, min_ngram=1) == _brute_force(context, 3, 3, 1)


def _brute_force(context, k, max_ngram, min_ngram):
    for n in range(max_ngram, min_ngram - 1, -1):
        if len(context) <= n:
            continue
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + k]
    return []


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(k=-1), "k"),
        (dict(k=2, min_ngram=0), "min_ngram"),
        (dict(k=2, max_ngram=1, min_ngram=2), "max_ngram"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        propose([1, 2, 1], **kwargs)


def test_two_dimensional_tensor_is_rejected():
    with pytest.raises(ValueError, match="1-D"):
        propose(torch.zeros(2, 3, dtype=torch.long), k=2)
