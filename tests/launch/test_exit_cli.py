"""``draftsmith exit-layer`` end to end on a tiny target."""

from __future__ import annotations

import json


def test_command_on_the_tiny_pair(tiny_pair, tmp_path, capsys):
    from draftsmith.launch.cli import main

    out = tmp_path / "exit.json"
    assert main(["exit-layer", "--target", str(tiny_pair["target"]), "--prompts", "2", "--max-new-tokens", "8",
                 "--threads", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["chosen"]["exit_layer"] == 1 and len(record["agreement"]) == 2 and record["table"]
    assert '"exit_layer": 1' in capsys.readouterr().out
