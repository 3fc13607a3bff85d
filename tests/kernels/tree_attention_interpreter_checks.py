"""Triton tree attention against its reference, run in a fresh process under ``TRITON_INTERPRET=1`` (why a child
process: see ``triton_interpreter_checks.py``). Prints one JSON object of measured errors; the assertions live in
``test_tree_attention.py``."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import json  # noqa: E402

import torch  # noqa: E402

from draftsmith.kernels.tree_attention import tree_attention, tree_attention_reference  # noqa: E402

# (batch, query heads, kv heads, head dim, prefix, tree parents)
CASES = {
    "gqa-odd-tree": (2, 4, 2, 16, 7, [-1, -1, 0, 0, 1]),  # T = 5 (+ pending row below)
    "mha-chain-no-prefix": (1, 3, 3, 32, 0, list(range(-1, 12))),  # T = 13, a chain
    "gqa-wide-tree": (1, 6, 2, 16, 40, [-1, -1, -1, 0, 0, 1, 2, 3, 3, 5, 6, 8, 9, 9, 10, 11, 12, 13, 14, 15, 16, 17]),
}


def ancestors(parents: list[int]) -> torch.Tensor:  # [T, T] with the pending token as row 0
    n = len(parents) + 1
    m = torch.zeros(n, n, dtype=torch.bool)
    m[:, 0] = True
    for i, p in enumerate(parents):
        row = i + 1
        if p >= 0:
            m[row] = m[p + 1]
        m[row, row] = True
    return m


def run(case, dtype) -> dict:
    b, hq, hkv, d, prefix, parents = CASES[case]
    tree = ancestors(parents)
    t = tree.shape[0]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, t, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, prefix + t, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, prefix + t, d, generator=g).to(dtype)
    got = tree_attention(q, k, v, tree, backend="triton")
    want = tree_attention_reference(q, k, v, tree)
    return {"max_abs_err": (got.float() - want.float()).abs().max().item(), "max_abs_ref": want.float().abs().max().item(),
            "finite": bool(torch.isfinite(got).all()), "dtype_ok": got.dtype == dtype, "shape_ok": got.shape == q.shape}


def adapter_tree_step(model, tree_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill 9 tokens, then one tree step (the pending token + the tree) through the adapter; both logits."""
    from draftsmith.inference.core.adapter import ModelAdapter

    adapter = ModelAdapter(model)
    cache = adapter.new_cache()
    g = torch.Generator().manual_seed(1)
    prefill = adapter.forward(torch.randint(4, 128, (1, 9), generator=g), cache)
    depth = tree_mask.sum(1) - 1
    step = adapter.forward(torch.randint(4, 128, (1, tree_mask.shape[0]), generator=g), cache,
                           position_ids=9 + depth, tree=tree_mask)
    return prefill.logits, step.logits


def adapter_check() -> dict:
    """A tiny Llama (head dim 16) through the adapter with the Triton tree attention registered, against the
    default 4-D-mask sdpa path; counts the kernel's calls."""
    from draftsmith.data.tiny_models import random_model
    from draftsmith.kernels import tree_attention as module

    name = module.register_tree_attention("draftsmith_tree_triton_check", backend="triton")
    tree_mask = ancestors([-1, -1, 0, 0, 1, 3])
    base = adapter_tree_step(random_model("llama", hidden=64), tree_mask)
    model = random_model("llama", hidden=64)
    model.set_attn_implementation(name)
    calls = []
    kernel = module.tree_attention
    module.tree_attention = lambda *a, **k: calls.append(k["backend"]) or kernel(*a, **k)
    try:
        got = adapter_tree_step(model, tree_mask)
    finally:
        module.tree_attention = kernel
    return {"prefill_max_abs_err": (got[0] - base[0]).abs().max().item(),
            "tree_max_abs_err": (got[1] - base[1]).abs().max().item(),
            "tree_max_abs_logit": base[1].abs().max().item(), "kernel_calls": calls,
            "layers": model.config.num_hidden_layers}


def main() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    from draftsmith.kernels import triton_tree_attention as module

    results = {"interpreted": isinstance(module._tree_attention_kernel, InterpretedFunction)}
    for case in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            results[f"{case}-{str(dtype).removeprefix('torch.')}"] = run(case, dtype)
    results["adapter-llama"] = adapter_check()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
