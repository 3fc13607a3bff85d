"""A stand-in for the vLLM environment in tests: an "interpreter" that runs :func:`main` here instead of the
runner it is handed, answering the runner's protocol (request file in, result file out) with transformers' greedy
decoding of the requested model and synthetic draft counters (every answer of ``n`` tokens: ``n // (k + 1) + 1``
drafts, position ``i`` accepted in ``drafts // (i + 1)`` of them), or, for a streaming request, one stream line per
batch. ``FAKE_ENGINE_FAIL=1`` makes it answer an error (after logging ``FAKE_ENGINE_SAYS``); ``FAKE_ENGINE_STOP_AFTER=N`` makes it die after N batches.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from draftsmith.inference.engines.environment import VLLM_VERSION


def make_fake_engine(directory: Path) -> Path:
    """An executable that stands in for the engine environment's python."""
    path = directory / "fake-python"
    versions = json.dumps({"vllm": VLLM_VERSION, "torch": "fake", "transformers": "fake", "python": "fake"})
    path.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo '{versions}'; exit 0; fi\n"  # engine_versions' probe
                    f"exec {sys.executable} {Path(__file__).resolve()} \"$2\" \"$3\"\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def counters(n: int, k: int) -> dict:
    if not k:
        return {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    drafts = n // (k + 1) + 1
    per_pos = [drafts // (i + 1) for i in range(k)]
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted": sum(per_pos), "per_pos": per_pos}


def main(request_path: str, result_path: str) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    request = json.loads(Path(request_path).read_text())
    if os.environ.get("FAKE_ENGINE_FAIL"):
        print(os.environ.get("FAKE_ENGINE_SAYS", ""), flush=True)  # what vLLM would have logged
        Path(result_path).write_text(json.dumps({"error": "ValueError: the fake engine was told to fail"}))
        return 1
    model = AutoModelForCausalLM.from_pretrained(request["model"]).eval()
    eos = AutoTokenizer.from_pretrained(request["tokenizer"]).eos_token_id

    def greedy(prompt):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=request["max_tokens"], do_sample=False,
                                 eos_token_id=eos, pad_token_id=eos if eos is not None else 0)
        return out[0, len(prompt):].tolist()

    if request.get("stream"):
        stop = int(os.environ.get("FAKE_ENGINE_STOP_AFTER", len(request["batches"])))
        with open(request["stream"], "a") as f:
            for b, batch in enumerate(request["batches"][:stop]):
                f.write(json.dumps({"batch": b, "token_ids": [greedy(p) for p in batch], "seconds": 0.1}) + "\n")
                f.flush()
        if stop < len(request["batches"]):
            return 1
        Path(result_path).write_text(json.dumps({"versions": {"vllm": "fake"}, "results": [], "throughput": []}))
        return 0
    k = int((request.get("speculative_config") or {}).get("num_speculative_tokens") or 0)
    results = []
    for prompt in request["prompts"]:
        tokens = greedy(prompt)
        results.append({"token_ids": tokens, "seconds": 0.01 * (len(tokens) + 1), "spec": counters(len(tokens), k)})
    throughput = [{"concurrency": c, "requests": len(results), "output_tokens": sum(len(r["token_ids"]) for r in results),
                   "seconds": 0.005 * c} for c in request.get("concurrency") or []]
    Path(result_path).write_text(json.dumps({"versions": {"vllm": "fake"}, "load_seconds": 0.0, "results": results,
                                             "throughput": throughput}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
