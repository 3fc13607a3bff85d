"""Run a worker script under ``torchrun --nproc_per_node 2`` (CPU, gloo) and read the JSON its rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def two_process_result(script: Path, out: Path, port: int, timeout: int = 900) -> dict:
    """``script OUT`` on 2 processes; the JSON object rank 0 wrote to ``out`` (fails the test on a non-zero exit)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--nproc_per_node", "2", "--master_port",
                           str(port), str(script), str(out)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(Path(out).read_text())
