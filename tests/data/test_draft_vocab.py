"""The one draft-vocabulary builder and its three uses: the zoo's draft (most frequent + specials), EAGLE-3's
d2t/t2d maps (most frequent, ties to the smaller id; the target's answers first, the dataset's responses breaking
ties), DistillSpec's refit to the target's answers."""

from __future__ import annotations

import pytest
import torch

from draftsmith.data.draft_vocab import answer_token_counts, draft_vocab_coverage, draft_vocabulary, ranked_counts


def _by_count(counts: torch.Tensor, size: int) -> list[int]:
    """The plain definition: the ``size`` most frequent ids, ties to the smaller id, ascending."""
    return sorted(sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))[:size])


@pytest.mark.parametrize("seed", range(5))
def test_without_a_current_vocabulary_it_keeps_the_most_frequent_ids(seed):
    counts = torch.randint(0, 4, (200,), generator=torch.Generator().manual_seed(seed))  # [V] many ties
    for size in (1, 17, 200, 300):
        assert draft_vocabulary(counts, size).tolist() == _by_count(counts, size)
        assert draft_vocabulary(counts, size, min_count=3).tolist() == _by_count(counts, size)  # no effect alone


def test_refit_ranks_frequent_answer_tokens_then_the_drafts_own():
    counts = torch.tensor([0, 0, 9, 1, 5, 0, 2, 1, 0, 3])  # [V=10] answer-token counts
    current = torch.tensor([3, 5, 7, 8])  # the draft's vocabulary before
    # specials 0, 1; then seen >= 2 times: 2 (9), 4 (5), 9 (3), 6 (2); then the draft's own: 3, 7 (seen once), 5, 8
    refit = dict(current=current, min_count=2)
    assert draft_vocabulary(counts, 8, always=[0, 1], **refit).tolist() == [0, 1, 2, 3, 4, 6, 7, 9]
    assert draft_vocabulary(counts, 4, always=[0, 1], **refit).tolist() == [0, 1, 2, 4]
    assert draft_vocabulary(counts, 4, current=current, min_count=10).tolist() == [3, 5, 7, 8]  # nothing frequent
    assert draft_vocabulary(counts, 6, current=current, min_count=1).tolist() == [2, 3, 4, 6, 7, 9]
    assert draft_vocabulary(counts, 1, always=[0, 1, 99]).tolist() == [0, 1]  # always in; out-of-range ids dropped


def test_answer_counts_and_coverage_count_labelled_tokens_only():
    rows = [{"input_ids": [1, 2, 3, 3], "labels": [-100, 2, 3, 3]}, {"input_ids": [4, 4]}]  # no labels: all count
    counts = answer_token_counts(rows, 6)  # [V]
    assert counts.tolist() == [0, 0, 1, 2, 2, 0]
    t2d = torch.zeros(6, dtype=torch.bool)
    t2d[draft_vocabulary(counts, 2)] = True  # 3 and 4
    assert draft_vocab_coverage(rows, t2d) == pytest.approx(4 / 5)


def test_ranked_counts_let_the_first_counts_decide_and_the_second_break_ties():
    answers = torch.tensor([0, 3, 3, 1, 0, 0])  # [V=6] the target's answers
    responses = torch.tensor([9, 0, 4, 7, 2, 0])  # the dataset's responses
    merged = ranked_counts(answers, responses)
    assert sorted(range(6), key=lambda i: (-int(merged[i]), i)) == [2, 1, 3, 0, 4, 5]  # 2 before 1: a tie, 4 > 0
    assert draft_vocabulary(merged, 3).tolist() == [1, 2, 3]  # 0, the responses' favourite, never in an answer
    assert draft_vocabulary(merged, 4).tolist() == [0, 1, 2, 3]  # ... first of the tokens the answers never use
    with pytest.raises(ValueError, match=">= 0"):
        ranked_counts(torch.tensor([-1]), torch.tensor([0]))
