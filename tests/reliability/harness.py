"""The reliability suite's harness (loaded by conftest.py, which hands it out as the ``harness`` fixture): run a
command in process with its output captured, hold the outcome to the promises of docs/RELIABILITY.md, count what
was tried and what broke (:class:`Ledger`), and swap a function for a stub wherever a module holds it (in the test,
never in product code)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shlex
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from reliability_ledger import Ledger, Violation

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = "accepted"  # the command took the input and reached the (stubbed) expensive work
COMMAND_SECONDS = 120  # one in-process command longer than this is a hang
MEMORY_HEADROOM = 4 << 30  # bytes of heap one command may add before it counts as runaway
TEMP_NAME = re.compile(r"(\.tmp$|^\.staging$|\.incomplete$|\.part$|\.partial$)")


class Accepted(BaseException):
    """Raised by a stub in place of the expensive work once a command has accepted its input."""


class Hang(BaseException):
    """Raised by the alarm when one in-process command runs past :data:`COMMAND_SECONDS`."""


@dataclass
class Outcome:
    code: int | str | None  # exit status, ACCEPTED, or None when an exception escaped
    stdout: str
    stderr: str
    escaped: str | None = None  # "TypeError: ..." (at file:line) of an exception that escaped the command
    seconds: float = 0.0


@contextlib.contextmanager
def _fd_capture():
    """Also catch what C code, threads and loggers bound to the real streams write to fds 1 and 2."""
    saved, files = [], []
    for fd in (1, 2):
        sys.__stdout__.flush()
        sys.__stderr__.flush()
        f = tempfile.TemporaryFile(mode="w+b")
        saved.append(os.dup(fd))
        files.append(f)
        os.dup2(f.fileno(), fd)
    texts: list[str] = []
    try:
        yield texts
    finally:
        for fd, old, f in zip((1, 2), saved, files):
            os.dup2(old, fd)
            os.close(old)
            f.seek(0)
            texts.append(f.read().decode("utf-8", errors="replace"))
            f.close()


@contextlib.contextmanager
def _limits(seconds: int, headroom: int):
    """One thread (tiny models run fastest so, the more on a shared machine), an alarm after ``seconds`` (left alone
    when an outer one, such as pytest-timeout's, rings sooner) and a heap cap ``headroom`` above today's."""
    import torch

    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer = signal.getitimer(signal.ITIMER_REAL)[0]
    ours = not outer or outer > seconds
    if ours:
        signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    cap = _data_bytes() + headroom if _data_bytes() else resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_DATA, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    start = time.monotonic()
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        torch.set_num_threads(threads)
        if ours:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001) if outer else 0)
            signal.signal(signal.SIGALRM, outer_handler)


def _data_bytes() -> int:
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return next((int(ln.split()[1]) * 1024 for ln in lines if ln.startswith("VmData:")), 0)


def _escaped(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/tests/" not in f.filename]
    ours = [f for f in frames if str(ROOT) in f.filename and "/.venv/" not in f.filename]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    text = str(err).strip().splitlines()
    at = f" (at {Path(where.filename).relative_to(ROOT) if str(ROOT) in where.filename else Path(where.filename).name}" \
         f":{where.lineno})" if where else ""
    name = type(err).__qualname__ if type(err).__module__ == "builtins" else f"{type(err).__module__}.{type(err).__qualname__}"
    return f"{name}: {text[0][:200] if text else ''}{at}"


@contextlib.contextmanager
def _hub_offline(offline: bool):
    """The hub offline, as on the machines the suite runs on: a fuzzed name that is not a local path would otherwise
    spend half a minute in retries (``test_a_mistyped_target_fails_fast`` checks that path once, online)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = offline or before
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def run_captured(call, seconds: int = COMMAND_SECONDS, offline: bool = True) -> Outcome:
    """Run ``call()`` (a command returning its exit status) with stdout and stderr captured, SystemExit turned into its
    status, :class:`Accepted` into ``"accepted"``, and anything else that escapes recorded."""
    out, err = io.StringIO(), io.StringIO()
    code, escaped, start = None, None, time.perf_counter()
    with _fd_capture() as fds, _hub_offline(offline):
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                with _limits(seconds, MEMORY_HEADROOM):
                    code = call()
                code = 0 if code is None else code
            except Accepted:
                code = ACCEPTED
            except SystemExit as exit_:
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
                code = 0 if exit_.code is None else (exit_.code if isinstance(exit_.code, int) else 1)
            except Hang as hang:
                escaped = f"hang: {hang}"
            except BaseException as exc:  # noqa: BLE001 - a traceback the user would have seen
                escaped = _escaped(exc)
    return Outcome(code, out.getvalue() + fds[0], err.getvalue() + fds[1], escaped, time.perf_counter() - start)


def problems(outcome: Outcome, out_dir: Path | None, *, may_succeed: bool = True) -> list[tuple[str, str]]:
    """The broken promises of one outcome: ``[(kind, detail)]`` (empty when it kept them all)."""
    found = []
    err = outcome.stderr
    lines = [line for line in re.split(r"[\r\n]+", err) if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if outcome.escaped:
        found.append(("hang" if outcome.escaped.startswith("hang") else "traceback", outcome.escaped))
    elif "Traceback (most recent call last)" in err:
        found.append(("traceback", next((ln for ln in reversed(lines) if not ln.startswith(" ")), "?")))
    if outcome.code == 2:
        if any(line.startswith("usage:") for line in lines):
            found.append(("usage dump", next((ln for ln in reversed(lines) if "error" in ln), lines[-1])[:300]))
        elif len(errors) != 1:
            found.append(("error lines", f"{len(errors)} 'error:' lines: {' | '.join(lines[-3:])[:300]}"))
        elif lines[-1] != errors[0]:
            found.append(("error not last", f"{errors[0][:150]} ... then {lines[-1][:150]}"))
    elif outcome.code in (0, ACCEPTED):
        if not may_succeed:
            found.append(("accepted bad input", f"exit {outcome.code}"))
        if errors:
            found.append(("error on success", errors[0][:300]))
    elif outcome.escaped is None:
        found.append(("exit code", f"exit {outcome.code}: {' | '.join(lines[-2:])[:300]}"))
    if out_dir is not None:
        found += [("half-written file", d) for d in half_written(out_dir, finished=outcome.code in (0, ACCEPTED))]
    return found


def half_written(root: Path, finished: bool = False, parse: bool = True) -> list[str]:
    """Temporary files; with ``parse``, JSON that does not parse and JSON-lines files with a torn or broken line;
    when ``finished``, also a resume journal (``*.partial.*``) left behind."""
    found = []
    for path in sorted(root.rglob("*")) if root.exists() else []:
        rel = path.relative_to(root)
        if TEMP_NAME.search(path.name) or (finished and ".partial." in path.name):
            found.append(f"{rel} left behind")
        elif parse and path.is_file() and path.suffix == ".json":
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError, RecursionError):
                found.append(f"{rel} is not valid JSON")
        elif parse and path.is_file() and path.suffix == ".jsonl" and path.stat().st_size:
            data = path.read_bytes()
            lines = data.decode("utf-8", errors="replace").splitlines()
            if not data.endswith(b"\n"):
                found.append(f"{rel} ends in a torn line")
            elif not all(_parses(line) for line in lines if line.strip()):
                found.append(f"{rel} holds a broken line")
    return found


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def file_modes(root: Path) -> list[str]:
    """Files under ``root`` whose permissions are not what the umask gives a new file (0644 under umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    want = 0o666 & ~mask
    return [f"{p.relative_to(root)} has mode {p.stat().st_mode & 0o777:o}, not {want:o}"
            for p in sorted(root.rglob("*")) if p.is_file() and p.stat().st_mode & 0o777 != want]


# --------------------------------------------------------------------------------------------------- harness


@contextlib.contextmanager
def swapped(original, replacement=None):
    """``original`` (a function; or a mapping of originals to replacements) replaced wherever a module holds it, and
    put back afterwards, also in modules imported meanwhile (stubs in the test only; product code is never patched)."""
    swaps = original if replacement is None else {original: replacement}
    back = {id(new): old for old, new in swaps.items()}

    def sites(values: dict):
        for module in list(sys.modules.values()):
            try:
                hits = [(k, v) for k, v in vars(module).items() if values.get(id(v), values) is v]
            except TypeError:
                continue
            yield from ((module, k, v) for k, v in hits)

    for module, name, value in list(sites({id(old): old for old in swaps})):
        setattr(module, name, swaps[value])
    try:
        yield
    finally:
        for module, name, value in list(sites({id(new): new for new in swaps.values()})):
            setattr(module, name, back[id(value)])


def accept(*args, **kwargs):
    raise Accepted


def command_line(argv: list[str], prefix: str = "draftsmith") -> str:
    return shlex.join([prefix, *map(str, argv)])


def file_recipe(path: Path, data: bytes, limit: int = 600) -> str:
    """A shell line that writes ``data`` to ``path`` (what a reproducer needs of a fuzzed input file)."""
    if len(data) > limit:
        return f"# {path.name}: {len(data)} bytes (first {limit}): {data[:limit]!r}"
    return f"printf %s {shlex.quote(data.decode('latin-1'))} > {shlex.quote(str(path))}"


def junk():
    """Hypothesis values of any JSON shape: odd scalars, paths, small lists and objects."""
    from hypothesis import strategies as st

    scalars = st.one_of(st.integers(-2, 2), st.sampled_from([2**63, -(2**31), 10**100]), st.floats(allow_nan=True),
                        st.text(max_size=8), st.booleans(), st.none(),
                        st.sampled_from(["", "draft", "../draft", "/etc", "draft/model.safetensors", "a" * 300]))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=2),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=2)),
                        max_leaves=4)


class Harness:
    """Runs commands in process and holds their outcomes to the promises (one :class:`Ledger` per pytest run)."""

    ACCEPTED, Accepted = ACCEPTED, Accepted
    accept, swapped, command_line, file_recipe = map(staticmethod, (accept, swapped, command_line, file_recipe))
    half_written, file_modes, run_captured, problems = map(staticmethod, (half_written, file_modes, run_captured,
                                                                          problems))
    recipe_argv = staticmethod(lambda pair, out, method, config=None: recipe_argv(pair, out, method, config))

    def __init__(self, ledger: Ledger, scratch: Path) -> None:
        self.ledger, self.scratch, self._n = ledger, scratch, 0

    def fresh(self, name: str) -> Path:
        """A new empty directory for one example."""
        self._n += 1
        path = self.scratch / "cases" / f"{name}-{self._n:05d}"
        path.mkdir(parents=True)
        return path

    def cli(self, argv: list, offline: bool = True) -> Outcome:
        from draftsmith.launch.cli import main

        return run_captured(lambda: main([str(a) for a in argv]), offline=offline)

    def check(self, area: str, outcome: Outcome, out_dir: Path | None, reproducer: str, *,
              may_succeed: bool = True, modes: bool = False) -> list[tuple[str, str]]:
        """Count the input, and record (survey) or raise (default) every broken promise of its outcome."""
        self.ledger.inputs[area] += 1
        self.ledger.seconds[area] += outcome.seconds
        self.ledger.note_time(area, outcome.seconds, reproducer[:300])
        self.ledger.outcomes[str(outcome.code) if outcome.escaped is None else "escaped"] += 1
        found = problems(outcome, out_dir, may_succeed=may_succeed)
        if modes and out_dir is not None and outcome.code in (0, ACCEPTED):
            found += [("file mode", m) for m in file_modes(out_dir)]
        self.report(area, found, reproducer, outcome)
        return found

    def report(self, area: str, found: list[tuple[str, str]], reproducer: str, outcome: Outcome | None = None) -> None:
        for kind, detail in found:
            self.ledger.record(Violation(area, kind, detail, reproducer))
        if found and not self.ledger.survey:
            tail = outcome.stderr[-1500:] if outcome else ""
            raise AssertionError(f"{area}: {found}\nreproduce: {reproducer}\nstderr tail:\n{tail}")

    def explore(self, test, examples: int) -> None:
        """Run a ``@given`` function for ``examples`` inputs (no deadline, no example database; no shrinking in
        survey mode, where nothing raises). The same inputs every run (a test suite that passes or fails alike on
        every machine), unless ``DRAFTSMITH_RELIABILITY_RANDOM=1`` asks for fresh ones."""
        from hypothesis import HealthCheck, Phase, settings

        phases = (Phase.generate,) if self.ledger.survey else (Phase.generate, Phase.shrink)
        fresh = os.environ.get("DRAFTSMITH_RELIABILITY_RANDOM") == "1"
        settings(max_examples=examples, deadline=None, database=None, phases=phases, print_blob=True,
                 derandomize=not fresh, suppress_health_check=list(HealthCheck))(test)()


def recipe_argv(pair: dict, out: Path, method: str, config: Path | None = None) -> list[str]:
    """The tiny pair's settings for ``method`` (its ``launch/configs/recipes/<method>_test.yaml`` unless ``config``)."""
    from draftsmith.common.registry import get_method

    config = config or ROOT / "launch" / "configs" / "recipes" / f"{method}_test.yaml"
    argv = ["--config", str(config), "--target", str(pair["target"]), "--dataset", str(pair["dataset"]),
            "--output_dir", str(out)]
    if "draft" in get_method(method).models:
        argv += ["--draft", str(pair["draft"])]
    return argv
