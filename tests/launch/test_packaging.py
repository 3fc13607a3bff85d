"""The wheel carries exactly the `draftsmith` package tree, and every module imports from it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = {
    "common": "draftsmith.common",
    "trainers": "draftsmith.trainers",
    **{f"trainers/{m}": f"draftsmith.trainers.{m}"  # every method's own package (pyproject.toml must list it)
       for m in sorted(p.parent.name for p in (ROOT / "trainers").glob("*/__init__.py"))},
    "data": "draftsmith.data",
    "inference": "draftsmith.inference",
    "inference/core": "draftsmith.inference.core",
    "inference/drafters": "draftsmith.inference.drafters",
    "inference/proposers": "draftsmith.inference.proposers",
    "inference/evaluation": "draftsmith.inference.evaluation",
    "inference/artefacts": "draftsmith.inference.artefacts",
    "inference/engines": "draftsmith.inference.engines",
    "inference/methods": "draftsmith.inference.methods",
    "kernels": "draftsmith.kernels",
    "launch": "draftsmith.launch",
}
MAX_MODULE_LINES = 450


def _expected_modules() -> list[str]:
    mods = []
    for folder, package in SUBPACKAGES.items():
        mods.append(package)
        for f in sorted((ROOT / folder).glob("*.py")):
            if f.name != "__init__.py":
                mods.append(f"{package}.{f.stem}")
    return mods


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"  # build from a copy so that setuptools' build/ never lands in the work tree
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", "runs")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("draftsmith-*.whl")
    return whl


def test_wheel_holds_only_the_draftsmith_tree(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"draftsmith"}, f"unexpected top-level entries: {top}"
    for mod in _expected_modules():
        path = mod.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, mod
    assert any(n.startswith("draftsmith/data/corpora/") and n.endswith(".gz") for n in names), "corpus not shipped"
    assert any("LICENSE" in n for n in names if n.startswith("draftsmith/data/corpora/"))
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert entry and "draftsmith = draftsmith.launch.cli:main" in zipfile.ZipFile(wheel).read(entry[0]).decode()


def test_every_module_imports_from_the_installed_wheel(wheel, tmp_path):
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    # install the wheel alone into the scratch environment; its dependencies come from ours, read
    # through a .pth line (which does not run our editable-install hook)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, str(wheel)],
        check=True, capture_output=True,
    )
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    script = (
        "import importlib, importlib.util, sys\n"
        f"mods = {_expected_modules()!r}\n"
        "for m in mods:\n"
        "    mod = importlib.import_module(m)\n"
        f"    assert mod.__file__.startswith({site!r}), (m, mod.__file__)\n"
        "for bad in ('data', 'trainers', 'inference', 'kernels', 'launch'):\n"
        "    assert importlib.util.find_spec(bad) is None, bad\n"
        "print(len(mods))\n"
    )
    res = subprocess.run([str(py), "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert int(res.stdout.strip()) == len(_expected_modules())


def _module_file(module: str) -> Path:
    package, _, stem = module.rpartition(".")
    folder = {v: k for k, v in SUBPACKAGES.items()}[package]
    return ROOT / folder / f"{stem}.py"


def _imports(module: str) -> set[str]:
    """Every draftsmith module ``module`` imports, at any depth of its code (function-level imports too)."""
    tree = ast.parse(_module_file(module).read_text())
    known = set(_expected_modules())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("draftsmith."):
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("draftsmith.")}
    return {m for m in found if m in known and m != module and m not in SUBPACKAGES.values()}


def test_the_source_tree_and_the_package_map_list_the_same_packages():
    folders = {str(p.parent.relative_to(ROOT)) for p in ROOT.glob("*/**/__init__.py")
               if not {".venv", "tests", "build", "recipes"} & set(p.parts)}
    assert folders == set(SUBPACKAGES)
    for folder in SUBPACKAGES:
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"{folder}/__init__.py needs a docstring saying what the package holds"


def test_no_import_cycle_inside_a_package_even_through_function_level_imports():
    modules = [m for m in _expected_modules() if m not in SUBPACKAGES.values()]
    graph = {m: {d for d in _imports(m) if d.rpartition(".")[0] == m.rpartition(".")[0]} for m in modules}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            assert state.get(d) != 1, "import cycle: " + " -> ".join(path[path.index(d):] + [d]) if d in path else d
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in modules:
        if m not in state:
            visit(m, [m])


def test_no_package_module_is_longer_than_the_limit():
    long = {m: n for m in _expected_modules() if m not in SUBPACKAGES.values()
            if (n := len(_module_file(m).read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"
