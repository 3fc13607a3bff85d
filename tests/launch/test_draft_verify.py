"""recipes/draft_verify.py end to end on a tiny random target: the study, the baselines beside it, the
weightless artefact, and `draftsmith eval --artefact` running it token-identically with the skip set pictured."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_search_writes_an_artefact_the_evaluator_runs(tiny_pair, tmp_path, capsys):
    import runpy
    import sys

    from draftsmith.launch.cli import main

    out = tmp_path / "search"
    argv = ["draft_verify.py", "--target", str(tiny_pair["target"]), "--output_dir", str(out), "--n-trials", "3",
            "--prompts", "2", "--max-new-tokens", "6", "--draft-length", "3", "--threads", "1", "--no-progress"]
    old = sys.argv
    sys.argv = argv
    try:
        try:
            runpy.run_path(str(ROOT / "recipes" / "draft_verify.py"), run_name="__main__")
        except SystemExit as done:
            assert done.code == 0
    finally:
        sys.argv = old
    manifest = json.loads((out / "artefact" / "manifest.json").read_text())
    assert manifest["method"] == "draft-verify" and manifest["kind"] == "none" and manifest["weights"] == {}
    search = manifest["training"]["search"]
    assert search["trials"] == 3 and search["best"] and (out / "study.db").is_file()
    assert {"plain_ar", "searched", "every_other_layer", "last_half"} <= manifest["training"]["calibration"].keys()
    report = tmp_path / "r.json"
    assert main(["eval", "--artefact", str(out / "artefact"), "--target", str(tiny_pair["target"]), "--limit", "2",
                 "--max-new-tokens", "8", "--warmup", "0", "--no-progress", "--threads", "1",
                 "--out", str(report)]) == 0
    rep = json.loads(report.read_text())
    skip = manifest["proposer"]
    if skip["skip_attention"] or skip["skip_mlp"]:
        assert rep["method"] == "draft-verify" and len(rep["skip_set"]["attention"]) == 2
    assert rep["summary"]["greedy_identical"] == 1.0


def test_an_empty_searched_set_decodes_plainly(tmp_path):
    """When no skip set beats plain decoding on the calibration prompts, the artefact says so and runs as AR."""
    from draftsmith.common.models import target_identity
    from draftsmith.data.tiny_models import random_model
    from draftsmith.inference.artefacts.manifest import write_artefact
    from draftsmith.inference.methods import load_artefact

    target = random_model("llama", seed=0, layers=2)
    write_artefact(tmp_path / "a", "none", method="draft-verify", target=target_identity(target, None),
                   proposer={"skip_attention": [], "skip_mlp": [], "draft_length": 4})
    proposer, manifest = load_artefact(tmp_path / "a", target, None)
    assert proposer is None and manifest["method"] == "draft-verify"


def test_threshold_rule_names_agree_everywhere():
    """The command lines list the rules without importing the proposer; they must name the same ones."""
    from draftsmith.inference.methods.draft_verify import THRESHOLD_RULE
    from draftsmith.inference.proposers.draft_verify import THRESHOLD_RULES
    from draftsmith.launch.draft_verify import THRESHOLD_RULE_NAMES, parser

    assert set(THRESHOLD_RULE_NAMES) == set(THRESHOLD_RULE.choices) == set(THRESHOLD_RULES)
    args = parser().parse_args([])
    assert args.threshold_rule == "reference" and args.pin_ends is False  # the reference's rule and search space
    assert parser().parse_args(["--pin-ends"]).pin_ends is True
