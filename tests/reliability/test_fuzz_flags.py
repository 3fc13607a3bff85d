"""Fuzzed command-line flags (reliability suite; see conftest.py): every option of every ``draftsmith`` command that
takes one (found by walking the parser, so a new flag is fuzzed the day it lands) given junk values — negative,
zero, huge, not-a-number, empty, unknown choices, paths that are not there — or left without its value. Every outcome
is exit 2 with one ``error:`` line, or accepted settings; model loading is stubbed away.

Not fuzzed: ``zoo``, ``engine`` and ``demo``, whose valid settings build a zoo or a vLLM environment (minutes)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

SKIPPED = ("zoo", "engine", "demo", "train")
VALUES = ["", "-1", "0", "-0", "1", "2", "abc", "nan", "inf", "-inf", "1e999", "1.5", "-3.5", "99999999999999999999",
          "0x10", "1_000", " 3", "all", "none", "None", "true", "cpu", "cuda", "cuda:7", "meta", "mps", "/nonexistent",
          "../../..", "/", "/dev/null", "é", "\x01", "--", "-", "tiny", "small", "dev", "corpus", "float16", "auto"]


def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """``"eval"``, ``"data generate"``, ... -> its parser, plus Draft & Verify's search (``train draft-verify``)."""
    from draftsmith.launch.cli import build_parser
    from draftsmith.launch.draft_verify import parser as draft_verify_parser

    found = {}

    def walk(parser, prefix):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[prefix] = parser
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    found = {k: v for k, v in found.items() if k.split()[0] not in SKIPPED}
    return found | {"train draft-verify": draft_verify_parser()}


def base_argv(command: str, pair: dict, artefact: Path, out: Path) -> list:
    """Settings that run ``command`` on the tiny pair (the real artefact where one is needed)."""
    target, data = pair["target"], pair["dataset"]
    return {
        "eval": ["--method", "ar", "--target", target, "--limit", "1", "--max-new-tokens", "2", "--out",
                 out / "report.json", "--no-progress"],
        "data generate": ["--target", target, "--prompts", data, "--out", out / "answers.jsonl", "--limit", "1",
                          "--max-new-tokens", "2", "--no-progress"],
        "data prompts": ["--target", target, "--out", out / "prompts.jsonl", "--count", "1", "--no-progress"],
        "data jacobi": ["--target", target, "--prompts", data, "--out", out / "traj.jsonl", "--limit", "1",
                        "--no-progress"],
        "tune": ["--artefact", artefact, "--target", target, "--prompts", "1", "--max-new-tokens", "2"],
        "export": ["--artefact", artefact, "--format", "eagle3", "--out", out / "export"],
        "exit-layer": ["--target", target, "--prompts", "1", "--max-new-tokens", "2", "--out", out / "exit.json"],
        "train draft-verify": ["--target", target, "--output_dir", out, "--n-trials", "1", "--prompts", "1",
                               "--max-new-tokens", "2", "--no-progress"],
    }.get(command, [])


def options(parser: argparse.ArgumentParser) -> list[tuple[str, bool]]:
    """``[(flag, takes a value)]`` of a parser, help and version left out."""
    out = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        out.append((max(action.option_strings, key=len), action.nargs != 0))
    return out


@st.composite
def flag_edits(draw, flags: list[tuple[str, bool]]) -> list[str]:
    tokens = []
    for flag, takes_value in draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3)):
        if not takes_value:
            tokens += [flag] if draw(st.booleans()) else [f"{flag}=x"]
            continue
        value = draw(st.one_of(st.sampled_from(VALUES), st.text(max_size=6), st.integers().map(str)))
        tokens += draw(st.sampled_from([[flag, value], [f"{flag}={value}"], [flag]]))
    return tokens


@pytest.mark.fuzz(60, 300)
def test_command_flags(harness, pair, artefact, examples):
    from draftsmith.common.models import load_model

    parsers = leaf_parsers()
    assert {"eval", "data generate", "data prompts", "tune", "export"} <= set(parsers)

    @given(command=st.sampled_from(sorted(parsers)), data=st.data())
    def one(command, data):
        edits = data.draw(flag_edits(options(parsers[command])), label="flags")
        case = harness.fresh("flags")
        argv = [*command.split(), *base_argv(command, pair, artefact, case / "out"), *edits]
        line = harness.command_line(argv).replace(f"{case}/", "").replace(str(pair["target"].parent), "$PAIR")
        repro = line.replace(str(artefact), "$ARTEFACT") + "   # $PAIR, $ARTEFACT: tests/common/tiny_pair.py, 2 steps"
        harness.check("command flags", harness.cli(argv), case / "out", repro)

    with harness.swapped(load_model, harness.accept):
        harness.explore(one, examples)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["eval", "data generate"])
def test_a_mistyped_target_fails_fast(harness, pair, command):
    """``--target`` naming neither a local model nor a known name, with the hub out of reach (as on every machine
    here): one ``error:`` line within 10 s, not half a minute of connection retries on stderr."""
    case = harness.fresh("mistyped")
    argv = [*command.split(), *base_argv(command, pair, None, case / "out")]
    argv[argv.index("--target") + 1] = "tiny-targte"
    outcome = harness.cli(argv, offline=False)
    line = harness.command_line(argv).replace(f"{case}/", "").replace(str(pair["target"].parent), "$PAIR")
    harness.check("mistyped target", outcome, case / "out", line, may_succeed=False)
    if outcome.seconds > 10:
        harness.report("mistyped target", [("slow error", f"exit {outcome.code} after {outcome.seconds:.0f} s")], line,
                       outcome)
