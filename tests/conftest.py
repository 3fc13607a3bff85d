"""Shared fixtures for the test suite."""

from __future__ import annotations

import os

import pytest
import torch

from draftsmith.data.tiny_models import FAMILIES

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param
