"""The work after training: which artefacts have a tree to calibrate."""

from __future__ import annotations

import json

from draftsmith.launch.after_training import drafts_trees


def test_a_peagle_head_has_no_tree_to_calibrate_and_the_others_do(tmp_path):
    assert drafts_trees(tmp_path)  # Medusa's and the draft model's artefacts: no heads_config of a chain-only head
    (tmp_path / "heads_config.json").write_text(json.dumps({"method": "eagle", "variant": "eagle3"}))
    assert drafts_trees(tmp_path)
    (tmp_path / "heads_config.json").write_text(json.dumps({"method": "eagle", "variant": "peagle"}))
    assert not drafts_trees(tmp_path)
