"""The verification-rows benchmark: its table and its run on a tiny model."""

import json

import pytest


@pytest.fixture(scope="module")
def rows(script_loader):
    return script_loader("bench_verify_rows")


def test_table_reports_each_size_against_one_row_and_its_padding(rows):
    table = rows.rows_table({1: [1.0, 1.2], 2: [1.5, 1.5], 3: [2.0, 2.2], 4: [1.6, 1.6]}, {3: 4})
    assert [r["rows"] for r in table] == [1, 2, 3, 4]
    assert table[2]["median_over_1"] == pytest.approx(2.1 / 1.1) and table[2]["padded_to"] == 4
    assert table[0]["min_ms"] == pytest.approx(1000.0) and "| 3 |" in rows.markdown(table)


def test_runs_on_a_tiny_model(rows, tmp_path, capsys):
    from draftsmith.data.tiny_models import random_model

    model = random_model("llama", seed=0, layers=1, hidden=32)
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "r.json"
    assert rows.main(["--target", str(tmp_path / "m"), "--repeats", "2", "--prefix", "8", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["rows"] for r in data["rows"]] == list(range(1, 17)) and "median ms" in capsys.readouterr().out
