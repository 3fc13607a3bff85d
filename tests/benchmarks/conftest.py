"""The benchmark scripts are not a package: tests load them by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest


def load_script(name: str) -> ModuleType:
    """The module ``tests/benchmarks/<name>.py``, imported by path."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def script_loader():
    return load_script
