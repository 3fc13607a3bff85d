"""The one reader of artefact directories: every command that reads an artefact (eval, tune, export, exit-layer, the
recipes' evaluation) reads it through :func:`read_manifest`, and compares it with a target through
:func:`check_target`.

Reading an artefact checks, each with a one-line :class:`ArtefactError` naming the field or the file and the fix:

- the manifest's shape: a JSON object in the current format whose fields the code reads have the types it reads
  (:func:`validate_manifest`);
- its ``method`` and ``kind`` against the method registry: a known method, and the artefact kind that method declares;
- every file of the artefact against the sha256 the manifest recorded when the artefact was saved (``files``: configs,
  tokenizer files and weights alike; everything but ``manifest.json``): a file missing, changed, or added where a
  loader would read it is refused; a kind that carries weights must list them (``weights``, the safetensors among
  ``files``);
- no pickle-based weight file anywhere in the directory.

Artefacts of the previous format (``draftsmith-artefact/1``, which hashed the safetensors only) are refused with the
fix: re-run the training, or re-save the manifest with
:func:`draftsmith.inference.artefacts.manifest.resave_manifest`.
"""

from __future__ import annotations

import json
import string
from pathlib import Path, PurePosixPath
from typing import Any

from draftsmith.common.errors import ArtefactError, DraftsmithError
from draftsmith.common.io import sha256_file
from draftsmith.common.models import target_identity
from draftsmith.common.registry import ARTEFACT_KINDS, REGISTRY

FORMAT = "draftsmith-artefact/2"
PREVIOUS_FORMAT = "draftsmith-artefact/1"  # sha256 of the safetensors only: refused, re-saved by resave_manifest
MANIFEST = "manifest.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# kind -> the directory (or file) its weights go to, relative to the artefact directory
WEIGHT_PATHS = {"draft_model": "draft", "adapted_target": "model", "lora_adapter": "adapter",
                "heads": "heads.safetensors", "embeddings": "embeddings.safetensors", "none": None}
TARGET_ADAPTER = "adapter"  # where a heads artefact keeps the LoRA adapter of a target its method tuned
READ_BY_NAME = (".json", ".safetensors")  # top-level files a loader may read by name: never ignored when unlisted
RESTORE = "restore the artefact directory as it was saved, or re-run the training that wrote it"


# ------------------------------------------------------------------------------------------------- the files


def artefact_files(directory: Path) -> list[str]:
    """Every file of the artefact at ``directory``, relative, sorted: all but ``manifest.json`` and hidden paths (a
    component starting with a dot, such as a half-written ``.staging/``)."""
    names = []
    for p in directory.rglob("*"):
        rel = p.relative_to(directory)
        if p.is_file() and rel.as_posix() != MANIFEST and not any(part.startswith(".") for part in rel.parts):
            names.append(rel.as_posix())
    return sorted(names)


def hash_files(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file of the artefact (:func:`artefact_files`): what a manifest records."""
    return {name: sha256_file(directory / name) for name in artefact_files(directory)}


def refuse_pickles(directory: Path) -> None:
    bad = [p for p in directory.rglob("*") if p.suffix in PICKLE_SUFFIXES and p.is_file()]
    if bad:
        raise ArtefactError(
            f"{bad[0]} is a pickle-based weight file, which draftsmith refuses to load or ship: "
            "re-save the weights as safetensors (save_pretrained(..., safe_serialization=True))"
        )


def _read_where_unlisted(manifest: dict) -> set[str]:
    """Top-level directories whose every file a loader reads (model directories): a file added there matters."""
    dirs = {name.split("/", 1)[0] for name in manifest["files"] if "/" in name}
    for extra in (WEIGHT_PATHS.get(manifest["kind"]), manifest.get("target_adapter"),
                  manifest["proposer"].get("model_dir")):
        if extra and not str(extra).endswith(".safetensors"):
            dirs.add(str(extra).split("/", 1)[0])
    return dirs


def verify_files(directory: Path, manifest: dict) -> None:
    """Every file the manifest lists is there with its recorded sha256, and no file was added where a loader would
    read it (inside a model directory, or a top-level ``.json``/``.safetensors``)."""
    listed = manifest["files"]
    for name, digest in listed.items():
        f = directory / name
        if not f.is_file():
            raise ArtefactError(f"{f}, listed in the artefact's manifest, is missing: copy the whole artefact directory, "
                                f"or {RESTORE}")
        if sha256_file(f) != digest:
            raise ArtefactError(f"{f} does not match its sha256 in the manifest (changed or corrupt since the artefact "
                                f"was saved): {RESTORE}")
    read_whole = _read_where_unlisted(manifest)
    for name in artefact_files(directory):
        if name in listed:
            continue
        top = name.split("/", 1)[0]
        if top in read_whole or ("/" not in name and name.endswith(READ_BY_NAME)):
            raise ArtefactError(f"{directory / name} is not in the artefact's manifest (added after the artefact was "
                                f"saved, and it would be loaded): remove it, or {RESTORE}")


# ------------------------------------------------------------------------------------------------- the manifest


def _fail(path: Path, field: str, want: str, value: Any) -> ArtefactError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return ArtefactError(f"{path}: field {field!r} must be {want}, got {shown}: restore the manifest.json the run "
                         "wrote, or re-run the training that wrote the artefact")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _relative_path(v: Any) -> bool:
    if not isinstance(v, str) or not v or "\\" in v:
        return False
    p = PurePosixPath(v)
    return not p.is_absolute() and ".." not in p.parts and "." not in p.parts


def _digest_map(path: Path, manifest: dict, key: str) -> dict[str, str]:
    value = manifest.get(key)
    if not isinstance(value, dict):
        raise _fail(path, key, "an object of relative file paths to sha256 digests", value)
    for name, digest in value.items():
        if not _relative_path(name) or name == MANIFEST:
            raise _fail(path, f"{key}.{name}", "a path inside the artefact directory", name)
        if not isinstance(digest, str) or len(digest) != 64 or digest.strip(string.hexdigits):
            raise _fail(path, f"{key}.{name}", "a sha256 hex digest", digest)
    return value


# option type -> (check, what it must be); a str option's value is parsed by its method (a list of layers, a tree's
# calibration, "auto"...), so any JSON value is passed on
_OPTION_TYPES = {int: (_is_int, "an integer"), float: (_is_number, "a number"),
                 dict: (lambda v: isinstance(v, dict), "an object")}
_TARGET_FIELDS = {"name_or_path": (lambda v: isinstance(v, str), "a string"),
                  "config_sha256": (lambda v: isinstance(v, str), "a string"),
                  "tokenizer_sha256": (lambda v: isinstance(v, str), "a string"),
                  "vocab_size": (_is_int, "an integer")}
_OPTIONAL_OBJECTS = ("training", "metrics", "tuning", "environment")


def check_kind(method: Any, kind: Any, path: Path, fix: str = "restore the manifest.json the run wrote, or re-run "
               "the training that wrote the artefact"):
    """The registry entry of ``method`` if ``kind`` is the artefact kind it declares; else a one-line error."""
    if not isinstance(method, str) or not method:
        raise _fail(path, "method", "a method name", method)
    if method not in REGISTRY.names():
        raise ArtefactError(f"{path}: artefact method {method!r} is not known to this draftsmith "
                            f"({', '.join(REGISTRY.names())}): upgrade draftsmith, or register the method")
    spec = REGISTRY.get(method)
    if not isinstance(kind, str) or kind not in ARTEFACT_KINDS:
        raise _fail(path, "kind", f"one of {', '.join(ARTEFACT_KINDS)}", kind)
    if kind != spec.artefact_kind:
        raise ArtefactError(f"{path}: field 'kind' is {kind!r}, but {method} artefacts are {spec.artefact_kind!r} "
                            f"(the method registry): {fix}")
    return spec


def _check_weights(path: Path, manifest: dict) -> None:
    """A kind that carries weights lists them (the safetensors under its weight path), each among ``files``."""
    files, weights, kind = manifest["files"], manifest["weights"], manifest["kind"]
    for name, digest in weights.items():
        if files.get(name) != digest:
            raise _fail(path, f"weights.{name}", "listed in 'files' with the same sha256", digest)
    where = WEIGHT_PATHS[kind]
    if where is None:
        return
    if not any(name == where or name.startswith(where + "/") for name in weights):
        raise ArtefactError(f"{path}: a {kind} artefact must list its weights ({where}) in 'weights' and 'files', but "
                            f"it lists {sorted(weights) or 'none'}: {RESTORE}")


def validate_manifest(manifest: Any, path: Path) -> dict:
    """``manifest`` (parsed from ``path``) if it has the current format, a registered method and its kind, and every
    field the code reads has the type it reads; else a one-line :class:`ArtefactError` naming the field."""
    if not isinstance(manifest, dict):
        raise ArtefactError(f"{path} holds a JSON {type(manifest).__name__}, not an artefact manifest (an object): "
                            f"{RESTORE}")
    fmt = manifest.get("format")
    if fmt == PREVIOUS_FORMAT:
        raise ArtefactError(f"{path} is in the previous artefact format ({PREVIOUS_FORMAT}, which did not hash its "
                            "configs): re-run the training that wrote it, or, if you trust its files, re-save it with "
                            f"draftsmith.inference.artefacts.manifest.resave_manifest('{path.parent}')")
    if fmt != FORMAT:
        raise _fail(path, "format", repr(FORMAT), fmt)
    spec = check_kind(manifest.get("method"), manifest.get("kind"), path)
    for key in ("target", "proposer"):
        if not isinstance(manifest.get(key), dict):
            raise _fail(path, key, "an object", manifest.get(key))
    for key, (ok, want) in _TARGET_FIELDS.items():
        value = manifest["target"].get(key)
        if value is not None and not ok(value):
            raise _fail(path, f"target.{key}", want, value)
    declared = spec.option_declarations()
    for key, value in manifest["proposer"].items():
        if key in declared and value is not None:
            ok, want = _OPTION_TYPES.get(declared[key].type, (lambda v: True, ""))
            if not ok(value):
                raise _fail(path, f"proposer.{key}", want, value)
    for key in _OPTIONAL_OBJECTS:
        if manifest.get(key) is not None and not isinstance(manifest[key], dict):
            raise _fail(path, key, "an object", manifest[key])
    _digest_map(path, manifest, "files")
    _digest_map(path, manifest, "weights")
    _check_weights(path, manifest)
    for key in ("target_adapter", "model_dir"):
        value = manifest.get(key) if key == "target_adapter" else manifest["proposer"].get(key)
        if value is not None and not (_relative_path(value) and any(n.startswith(f"{value}/") for n in manifest["files"])):
            raise _fail(path, key if key == "target_adapter" else f"proposer.{key}",
                        "a directory of the artefact listed in 'files'", value)
    return manifest


def load_manifest_json(directory: str | Path) -> tuple[Path, Any]:
    """``(path, parsed JSON)`` of the manifest of the artefact at ``directory`` (not validated)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ArtefactError(f"artefact directory {directory} does not exist: pass the --output_dir of a finished run")
    path = directory / MANIFEST
    if not path.is_file():
        raise ArtefactError(f"{path} is missing: {directory} is not a draftsmith artefact (rerun the recipe to export one)")
    try:
        return path, json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        where = f" at line {err.lineno}" if isinstance(err, json.JSONDecodeError) else ""
        raise ArtefactError(f"{path} is not valid JSON ({getattr(err, 'msg', 'not UTF-8')}{where}): {RESTORE}") from None
    except RecursionError:
        raise ArtefactError(f"{path} is not a manifest (JSON nested too deeply to read): {RESTORE}") from None
    except OSError as err:
        raise ArtefactError(f"{path} cannot be read ({err.strerror or err}): check its permissions") from None


def read_manifest(directory: str | Path) -> dict:
    """The manifest of the artefact at ``directory``, validated (:func:`validate_manifest`), with every file of the
    artefact verified against it (:func:`verify_files`). The one way draftsmith reads an artefact."""
    directory = Path(directory)
    path, manifest = load_manifest_json(directory)
    validate_manifest(manifest, path)
    refuse_pickles(directory)
    verify_files(directory, manifest)
    return manifest


def config_misfit(path: Path, err: Exception) -> Exception:
    """The error for a head/embedding config (``path``) that does not build the module its weights load into: a
    one-line :class:`ArtefactError` (a :class:`DraftsmithError` raised while building passes through unchanged)."""
    if isinstance(err, DraftsmithError):
        return err
    first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
    return ArtefactError(f"{path} does not describe the weights beside it ({type(err).__name__}: {first}): {RESTORE}")


# ------------------------------------------------------------------------------------------------- the target


def check_target(manifest: dict, model, tokenizer, allow_mismatch: bool = False,
                 escape: str | None = "--allow-target-mismatch to run anyway") -> list[str]:
    """Compare the artefact's recorded target with ``model``/``tokenizer``; returns the differences (when allowed) or
    raises :class:`ArtefactError`. ``escape``: the explicit way round it the caller offers, if any."""
    want = manifest["target"]
    have = target_identity(model, tokenizer)
    problems = []
    if want.get("vocab_size") not in (None, have["vocab_size"]):
        problems.append(f"vocabulary size {want['vocab_size']} vs {have['vocab_size']}")
    if want.get("config_sha256") and want["config_sha256"] != have["config_sha256"]:
        problems.append("model config hash differs")
    if want.get("tokenizer_sha256") and have["tokenizer_sha256"] and want["tokenizer_sha256"] != have["tokenizer_sha256"]:
        problems.append("tokenizer hash differs")
    if problems and not allow_mismatch:
        raise ArtefactError(
            f"this artefact was trained for target {want.get('name_or_path') or '?'} and the given target does not "
            f"match ({'; '.join(problems)}): pass that target" + (f", or {escape}" if escape else "")
        )
    return problems


def read_weights(path: str | Path) -> dict:
    """The tensors of an artefact's (or export's) safetensors file; a one-line ArtefactError when the file is not one
    (truncated, garbled: caught here even when a manifest was re-hashed to match it)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise ArtefactError(f"{path} is not a readable safetensors file ({str(err).splitlines()[0][:120]}): re-run the "
                            "training (or export) that wrote it") from None


__all__ = ["FORMAT", "MANIFEST", "PICKLE_SUFFIXES", "PREVIOUS_FORMAT", "TARGET_ADAPTER", "WEIGHT_PATHS",
           "artefact_files", "check_kind", "check_target", "config_misfit", "hash_files", "load_manifest_json",
           "read_manifest", "read_weights", "refuse_pickles", "validate_manifest", "verify_files"]
