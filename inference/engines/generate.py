"""``draftsmith data generate --engine vllm``: the target's answers through vLLM's continuous batching.

:func:`engine_completer` is a :data:`draftsmith.data.self_distill.Completer`: it starts the runner once in streaming
mode with every pending batch, and yields each batch's answers as the runner appends them to its stream file, so
:func:`~draftsmith.data.self_distill.generate_answers` writes rows batch by batch exactly as with the built-in
generator (same file, same resume: a killed run keeps every batch already on disk and a rerun answers the rest).
The engine's load time is counted in the first batch's seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from draftsmith.common.errors import EngineError
from draftsmith.inference.engines.environment import RUNNER, absolute_paths, engine_env


def read_stream(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines of ``path`` from byte ``offset`` on, and the offset after them (a line still being
    written is left for the next read)."""
    if not path.exists():
        return [], offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end


def engine_completer(python: Path, model_dir: str, tokenizer_dir: str, *, max_new_tokens: int,
                     temperature: float = 0.0, top_p: float = 1.0, dtype: str = "float32", threads: int | None = None,
                     log: Path | None = None, poll_seconds: float = 0.5):
    """A completer answering batches of prompt ids with vLLM in the environment of ``python``."""

    def complete(batches: list[list[list[int]]], seeds: list[list[int] | None]) -> Iterator[tuple[int, list, float]]:
        if not batches:
            return
        tmp = Path(tempfile.mkdtemp(prefix="draftsmith-engine-"))
        runner, req, out, stream = tmp / RUNNER.name, tmp / "request.json", tmp / "result.json", tmp / "stream.jsonl"
        shutil.copyfile(RUNNER, runner)
        req.write_text(json.dumps(absolute_paths({
            "model": model_dir, "tokenizer": tokenizer_dir, "dtype": dtype, "max_tokens": max_new_tokens,
            "temperature": temperature, "top_p": top_p, "batches": batches, "seeds": seeds,
            "stream": str(stream)})))
        log_file = open(log or tmp / "engine.log", "w")
        proc = subprocess.Popen([str(python), str(runner), str(req), str(out)], stdout=log_file,
                                stderr=subprocess.STDOUT, env=engine_env(threads), cwd=tmp)
        offset, last, received = 0, time.perf_counter(), 0
        try:
            while received < len(batches):
                lines, offset = read_stream(stream, offset)
                for line in lines:
                    now = time.perf_counter()
                    received += 1
                    yield int(line["batch"]), line["token_ids"], now - last  # the load time lands in the first
                    last = now
                if not lines:
                    if proc.poll() is not None and not read_stream(stream, offset)[0]:
                        result = json.loads(out.read_text()) if out.exists() else {}
                        raise EngineError(f"vLLM stopped after {received} of {len(batches)} batches: "
                                          f"{result.get('error') or 'see ' + str(log or 'its log')}; the rows "
                                          "answered so far are kept: rerun to answer the rest")
                    time.sleep(poll_seconds)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            log_file.close()
            shutil.rmtree(tmp, ignore_errors=True)

    return complete


__all__ = ["engine_completer", "read_stream"]
