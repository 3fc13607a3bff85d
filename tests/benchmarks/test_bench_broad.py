"""The broad-prompt benchmark driver: every setting is a valid `draftsmith eval` command line, and the tables."""

import pytest

from draftsmith.launch.cli import build_parser


@pytest.fixture(scope="module")
def broad(script_loader):
    return script_loader("bench_broad")


def test_every_setting_parses_as_draftsmith_eval(broad):
    for options in broad.SETTINGS.values():
        args = build_parser().parse_args(["eval", "--artefact", "x", "--questions", "broad", *options])
        assert args.questions == "broad"
        if options:  # a fixed setting stays fixed on an artefact tuned to an adaptive length policy
            assert args.draft_length_mode == "fixed"


def test_markdown_tables(broad):
    cell = {"tau": 2.0, "speedup": 1.1, "aggregate_speedup": 1.1, "predicted_speedup": 1.05, "measured_over_predicted": 1.048,
            "greedy_identical": 1.0, "proposer": {"draft_length": 4, "confidence_threshold": 0.4},
            "categories": {"writing": {"tau": 1.9, "speedup": 1.0}, "math": {"tau": 2.2, "speedup": 1.2}}}
    text = broad.markdown({"zoo draft": {"chosen": cell}, "distilled": {"chosen": cell}})
    assert "| zoo draft | chosen (k 4, conf 0.4) | 2.000 | 1.100 | 1.100 | 1.050 | 1.048 | 1.00 |" in text
    assert "| math | 2.200 / 1.200 | 2.200 / 1.200 |" in text
    pld = dict(cell, speedup=1.5, proposer={}, hf_prompt_lookup={"tau": 1.8, "speedup": 1.2})
    text = broad.markdown({"zoo draft": {"chosen": cell}, "prompt lookup": {"chosen": pld}})
    assert "| transformers' prompt lookup (same run as prompt lookup) | - | 1.800 | 1.200 | - | - | draftsmith ÷ transformers 1.25 | - |" in text
