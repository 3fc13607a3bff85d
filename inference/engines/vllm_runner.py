"""The vLLM runner: run by the engine environment's own interpreter, never imported by draftsmith.

draftsmith keeps its own versions (vLLM pins others), so it drives vLLM through this one file: a JSON request
file in, a JSON result file out (vLLM logs to both standard streams, so neither carries the result). It imports
nothing of draftsmith, only the standard library and vLLM::

    python vllm_runner.py request.json result.json

Request::

    {"model": DIR, "tokenizer": DIR, "dtype": "float32", "seed": 0, "max_model_len": 2048,
     "speculative_config": null | {"method": "eagle3", "model": DIR, "num_speculative_tokens": 5, ...},
     "prompts": [[token ids], ...],            # chat-formatted by draftsmith: both sides see the same tokens
     "max_tokens": 64, "ignore_eos": false,
     "sequential": true,                       # one request at a time: per-prompt seconds and draft counters
     "concurrency": [1, 4, 16]}                # throughput runs: prompts in waves of c concurrent requests

Result::

    {"versions": {...}, "load_seconds": s,
     "results": [{"token_ids": [...], "seconds": s, "spec": {"drafts", "draft_tokens", "accepted", "per_pos"}}],
     "throughput": [{"concurrency": c, "requests": n, "output_tokens": t, "seconds": s}]}

Greedy (temperature 0) for the evaluation round trip: it checks identity and acceptance, which sampling would blur.

Streaming (``draftsmith data generate --engine vllm``): ``{"stream": FILE, "batches": [[prompt ids, ...], ...],
"seeds": [[seed per prompt] | null, ...], "temperature": t, "top_p": p}``; each batch is answered with vLLM's
continuous batching and appended to FILE as one JSON line ``{"batch": b, "token_ids": [...], "seconds": s}``,
flushed to disk before the next, so a reader loses nothing when the run is killed.
"""

from __future__ import annotations

import json
import os
import sys
import time

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(llm) -> dict:
    """The engine's cumulative speculative-decoding counters (zeros without speculation)."""
    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POS:
            values = [int(v) for v in metric.values]
            out["per_pos"] = [a + b for a, b in zip(out["per_pos"] + [0] * len(values), values)] or values
    return out


def counter_delta(after: dict, before: dict) -> dict:
    per_pos = [a - (before["per_pos"][i] if i < len(before["per_pos"]) else 0) for i, a in enumerate(after["per_pos"])]
    return {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")} | {"per_pos": per_pos}


def versions() -> dict:
    import platform

    import torch
    import transformers
    import vllm

    return {"vllm": vllm.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def stream(llm, request: dict) -> None:
    """Answer ``request["batches"]`` one after the other, appending each to ``request["stream"]`` as it finishes."""
    from vllm import SamplingParams

    def params(seed):
        return SamplingParams(temperature=float(request.get("temperature", 0.0)), top_p=float(request.get("top_p", 1.0)),
                              max_tokens=int(request["max_tokens"]), seed=seed)

    seeds = request.get("seeds") or [None] * len(request["batches"])
    parent = os.getppid()
    with open(request["stream"], "a") as f:
        for b, batch in enumerate(request["batches"]):
            if os.getppid() != parent:  # draftsmith was killed: nobody reads the stream any more
                return
            row_seeds = seeds[b] or [None] * len(batch)
            t0 = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": list(p)} for p in batch], [params(s) for s in row_seeds],
                                use_tqdm=False)
            f.write(json.dumps({"batch": b, "token_ids": [list(o.outputs[0].token_ids) for o in outs],
                                "seconds": time.perf_counter() - t0}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def run(request: dict) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=request["model"], tokenizer=request.get("tokenizer") or request["model"],
              dtype=request.get("dtype", "float32"), seed=int(request.get("seed", 0)),
              max_model_len=request.get("max_model_len"), speculative_config=request.get("speculative_config"),
              disable_log_stats=False, enforce_eager=True, generation_config="vllm")  # no sampling defaults of the model's
    load_seconds = time.perf_counter() - started
    if request.get("stream"):
        stream(llm, request)
        return {"versions": versions(), "load_seconds": load_seconds, "results": [], "throughput": []}
    params = SamplingParams(temperature=0.0, max_tokens=int(request["max_tokens"]),
                            ignore_eos=bool(request.get("ignore_eos", False)))
    prompts = [{"prompt_token_ids": list(p)} for p in request.get("prompts", [])]
    if prompts:  # warm-up, unmeasured and outside the counters' deltas
        llm.generate(prompts[:1], params, use_tqdm=False)
    results = []
    if request.get("sequential", True):
        for prompt in prompts:
            before = spec_counters(llm)
            t0 = time.perf_counter()
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            seconds = time.perf_counter() - t0
            results.append({"token_ids": list(out.outputs[0].token_ids), "seconds": seconds,
                            "spec": counter_delta(spec_counters(llm), before)})
    throughput = []
    for c in request.get("concurrency") or []:
        t0, tokens = time.perf_counter(), 0
        for i in range(0, len(prompts), int(c)):
            tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts[i:i + int(c)], params,
                                                                           use_tqdm=False))
        throughput.append({"concurrency": int(c), "requests": len(prompts), "output_tokens": tokens,
                           "seconds": time.perf_counter() - t0})
    return {"versions": versions(), "load_seconds": load_seconds, "results": results, "throughput": throughput}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path) as f:
        request = json.load(f)
    try:
        result = run(request)
        code = 0
    except Exception as err:  # one line for draftsmith to show; the traceback goes to standard error
        import traceback

        traceback.print_exc(file=sys.stderr)
        result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
        code = 1
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(result_path + ".tmp", result_path)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
