"""The engine report's figures, from runner results alone, as vLLM defines them."""

from __future__ import annotations

import pytest

from draftsmith.inference.engines.report import (
    acceptance_figures,
    by_category,
    parity,
    parity_table,
    spec_totals,
    summarize,
    throughput,
)


def _result(tokens, drafts=0, accepted_per_pos=(), seconds=1.0):
    per_pos = list(accepted_per_pos)
    return {"token_ids": list(tokens), "seconds": seconds,
            "spec": {"drafts": drafts, "draft_tokens": drafts * len(per_pos), "accepted": sum(per_pos),
                     "per_pos": per_pos}}


def test_acceptance_by_position_is_per_draft_and_the_mean_length_counts_the_bonus_token():
    totals = spec_totals([_result([1, 2], 4, (3, 2, 1)), _result([3], 6, (3, 1))])
    assert totals == {"drafts": 10, "draft_tokens": 4 * 3 + 6 * 2, "accepted": 10, "per_pos": [6, 3, 1]}
    fig = acceptance_figures(totals)
    assert fig["acceptance_by_position"] == pytest.approx([0.6, 0.3, 0.1])
    assert fig["mean_acceptance_length"] == pytest.approx(1 + 10 / 10)
    assert fig["draft_acceptance_rate"] == pytest.approx(10 / 24)
    assert acceptance_figures(spec_totals([_result([1])]))["mean_acceptance_length"] is None  # nothing drafted


def test_summary_states_speed_against_the_engines_ar_and_identity_against_both_ars():
    spec = [_result([1, 2, 3], 1, (1,), seconds=1.0), _result([4, 5], 1, (0,), seconds=1.0)]
    ar = [_result([1, 2, 3], seconds=2.0), _result([4, 6], seconds=2.0)]
    s = summarize(spec, ar, [[1, 2, 3], [4, 5]])
    assert s["tokens_per_s"] == pytest.approx(2.5) and s["ar_tokens_per_s"] == pytest.approx(1.25)
    assert s["speedup"] == pytest.approx(2.0)
    assert s["identical_to_engine_ar"] == 0.5 and s["identical_to_draftsmith_ar"] == 1.0
    assert s["engine_ar_identical_to_draftsmith_ar"] == 0.5
    cats = by_category(["a", "b"], spec, ar, None)
    assert list(cats) == ["a", "b"] and cats["b"]["identical_to_engine_ar"] == 0.0


def test_throughput_pairs_each_concurrency_with_the_ar_run():
    rows = throughput([{"concurrency": 4, "requests": 8, "output_tokens": 400, "seconds": 2.0}],
                      [{"concurrency": 4, "requests": 8, "output_tokens": 400, "seconds": 4.0}])
    assert rows == [{"concurrency": 4, "requests": 8, "tokens_per_s": 200.0, "ar_tokens_per_s": 100.0,
                     "speedup": 2.0}]


def test_parity_lines_the_curves_up_and_names_the_largest_gap():
    p = parity([0.9, 0.7], [0.88, 0.75, 0.5])
    assert p["difference"] == pytest.approx([-0.02, 0.05, 0.5])
    assert p["max_abs_difference"] == pytest.approx(0.5)  # a position only one side drafted is a gap too
    assert "| 3 | 0.000 | 0.500 | +0.500 |" in parity_table(p)
