"""Which draft shape pays on a target: per-token decode cost of candidate drafts against the target's, and the
expected speedup each gives at a range of acceptance rates (docs/BENCHMARKS.md, "Real target").

    python tests/benchmarks/bench_draft_shapes.py --target smollm2-135m --threads 2

Candidates have the target's vocabulary; ``layers x width`` and, for the target's width, a draft vocabulary of
K rows (the LM head restricted to K tokens, as ``config.draft_vocab`` does). Weights are random: only the cost
matters here. The expected speedup uses the target's measured verification cost at ``gamma + 1`` tokens and the
standard chain formula E[tokens] = (1 - a^(g+1)) / (1 - a) (Leviathan et al. 2023, eq. 1), maximised over g.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import transformers

from draftsmith.common.models import load_model


def decode_ms(model, head: torch.Tensor | None = None, context: int = 200, tokens: int = 1, repeats: int = 25) -> float:
    """Median milliseconds of one cached forward over ``tokens`` new tokens after ``context`` (``head`` [K, H]:
    logits from those rows only)."""
    top = min(1000, model.config.vocab_size)
    ids = torch.randint(10, top, (1, context))
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            cache = model(ids, use_cache=True, logits_to_keep=1).past_key_values
            new = torch.randint(10, top, (1, tokens))
            started = time.perf_counter()
            if head is None:
                model(new, past_key_values=cache, use_cache=True)
            else:
                hidden = model.model(new, past_key_values=cache, use_cache=True).last_hidden_state  # [1, t, H]
                F.linear(hidden, head)
            times.append(time.perf_counter() - started)
    times.sort()
    return 1000 * times[len(times) // 2]


def shaped(target, layers: int, hidden: int) -> transformers.PreTrainedModel:
    cfg = target.config
    heads = max(1, hidden // 64)
    config = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=max(1, heads // 3) if heads % 3 == 0 else heads,
                                      tie_word_embeddings=True, max_position_embeddings=cfg.max_position_embeddings)
    return transformers.LlamaForCausalLM(config).eval()


def expected_speedup(ratio: float, verify: dict[int, float], alpha: float) -> tuple[float, int]:
    """max over gamma of E[tokens] / (gamma * ratio + verify[gamma + 1]) (costs relative to one target step)."""
    best = (0.0, 0)
    for gamma, cost in ((g, verify[g + 1]) for g in range(1, max(verify))):
        tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        best = max(best, (tokens / (gamma * ratio + cost), gamma))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    target = load_model(args.target, "float32").eval()
    width = target.config.hidden_size
    one = decode_ms(target)
    verify = {n: decode_ms(target, tokens=n) / one for n in range(1, 10)}
    print(f"target: {one:.1f} ms per token; verification of n tokens / one: "
          + ", ".join(f"{n}: {v:.2f}" for n, v in verify.items()))
    rows = []
    for layers, hidden, vocab in ((1, width, None), (2, width, None), (4, width, None), (2, 256, None),
                                  (4, 384, None), (1, width, 8192), (2, width, 8192), (2, width, 4096),
                                  (4, width, 8192)):
        model = shaped(target, layers, hidden)
        head = None if vocab is None else model.get_output_embeddings().weight[:vocab].detach().clone()
        ms = decode_ms(model, head)
        ratio = ms / one
        gains = {a: expected_speedup(ratio, verify, a) for a in (0.5, 0.6, 0.7, 0.8)}
        row = {"layers": layers, "width": hidden, "draft_vocab": vocab or target.config.vocab_size, "ms": round(ms, 2),
               "ratio": round(ratio, 3), **{f"speedup@{a}": round(s, 2) for a, (s, _) in gains.items()}}
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"target_ms": one, "verify": verify, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
