"""Tree attention on a CUDA GPU, by hand (not collected by pytest): prints one JSON object.

    python tests/kernels/cuda_tree_attention_check.py [--reps 200] [--skip-model]

(a) ``triton_tree_attention`` against ``tree_attention_reference`` for the interpreter checks' CASES and a
SmolLM2-135M-like shape (Hq 9, Hkv 3, D 64, prefix 300, 32 tree tokens, keys as views of a KV-cache buffer and
queries as attention's transposed view), float32 and bfloat16;
(b) a tiny Llama through ``ModelAdapter`` on a tree step with the registered tree attention
(``draftsmith.kernels.tree_attention.TREE_ATTENTION``) against the default sdpa + 4-D mask path;
(c) timings of the SmolLM2-like shape: the kernel (a few block sizes), the reference, transformers' sdpa attention
function under the adapter's 4-D additive mask, and the registered attention function end to end;
(d) a randomly initialised SmolLM2-135M-shaped model (30 layers) through the adapter: prefill 300 tokens, then a
32-token tree step with either attention, logits compared and the step timed.

Every section catches its own failure (``"error"``) so one JSON always comes out. A dry run of the script's logic
without a GPU: ``TRITON_INTERPRET=1 python tests/kernels/cuda_tree_attention_check.py --device cpu --reps 2
--skip-model`` (timings then by the wall clock, and meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.masks import additive_mask, visibility
from draftsmith.kernels import tree_attention as ta
from draftsmith.kernels.triton_tree_attention import _tree_attention_kernel, triton_tree_attention

DEVICE = "cuda"  # --device cpu: a dry run under TRITON_INTERPRET=1


def interpreter_cases() -> dict:
    """CASES and ``ancestors`` of tree_attention_interpreter_checks.py, whose import sets TRITON_INTERPRET=1: Triton
    is imported before (its kernels already compiled-mode) and the variable restored right after."""
    sys.path.insert(0, str(Path(__file__).parent))
    saved = os.environ.get("TRITON_INTERPRET")
    try:
        import tree_attention_interpreter_checks as checks
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved
    return {"cases": checks.CASES, "ancestors": checks.ancestors}


def random_parents(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return [-1 if i == 0 else int(torch.randint(-1, i, (1,), generator=g)) for i in range(n)]


def errors(got: torch.Tensor, want: torch.Tensor) -> dict:
    err = (got.float() - want.float()).abs().max().item()
    ref = want.float().abs().max().item()
    return {"max_abs_err": err, "max_abs_ref": ref, "rel": err / max(ref, 1e-30),
            "finite": bool(torch.isfinite(got).all())}


def section(fn):
    try:
        return fn()
    except Exception:  # noqa: BLE001 -- one JSON out whatever fails
        return {"error": traceback.format_exc()[-3000:]}


# ------------------------------------------------------------------------------------------------ (a) the kernel
def smollm_like(dtype, b=1, hq=9, hkv=3, d=64, prefix=300, nodes=31, capacity=512):
    """q as attention's transposed view of [B, T, Hq, D]; k, v as [:, :, :S] views of a cache buffer."""
    tree = ta_tree(random_parents(nodes))
    t = tree.shape[0]
    g = torch.Generator(device="cpu").manual_seed(0)
    q = torch.randn(b, t, hq, d, generator=g).to(DEVICE, dtype).transpose(1, 2)
    kbuf = torch.randn(b, hkv, capacity, d, generator=g).to(DEVICE, dtype)
    vbuf = torch.randn(b, hkv, capacity, d, generator=g).to(DEVICE, dtype)
    s = prefix + t
    return q, kbuf[:, :, :s], vbuf[:, :, :s], tree.to(DEVICE)


def ta_tree(parents: list[int]) -> torch.Tensor:  # pending token as row 0
    n = len(parents) + 1
    m = torch.zeros(n, n, dtype=torch.bool)
    m[:, 0] = True
    for i, p in enumerate(parents):
        if p >= 0:
            m[i + 1] = m[p + 1]
        m[i + 1, i + 1] = True
    return m


def kernel_checks() -> dict:
    from triton.runtime.jit import JITFunction

    out = {"compiled": isinstance(_tree_attention_kernel, JITFunction)}
    checks = interpreter_cases()
    for case, (b, hq, hkv, d, prefix, parents) in checks["cases"].items():
        tree = checks["ancestors"](parents).to(DEVICE)
        t = tree.shape[0]
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(0)
            q = torch.randn(b, hq, t, d, generator=g).to(DEVICE, dtype)
            k = torch.randn(b, hkv, prefix + t, d, generator=g).to(DEVICE, dtype)
            v = torch.randn(b, hkv, prefix + t, d, generator=g).to(DEVICE, dtype)
            got = triton_tree_attention(q, k, v, tree)
            out[f"{case}-{str(dtype)[6:]}"] = errors(got, ta.tree_attention_reference(q, k, v, tree))
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, tree = smollm_like(dtype)
        got = ta.tree_attention(q, k, v, tree, 0.125, backend="auto")
        want = ta.tree_attention_reference(q, k, v, tree, 0.125)
        out[f"smollm-like-{str(dtype)[6:]}"] = errors(got, want) | {"T": tree.shape[0], "S": k.shape[2]}
    return out


# ------------------------------------------------------------------------------------------------ (b) the adapter
def adapter_tree_step(adapter: ModelAdapter, prompt: torch.Tensor, ids: torch.Tensor, tree: torch.Tensor):
    cache = adapter.new_cache(1024)
    adapter.forward(prompt, cache, compute_logits=False)
    p = prompt.shape[1]
    return adapter.forward(ids, cache, position_ids=p + tree.sum(1) - 1, tree=tree).logits


def set_attention(model, name: str) -> None:
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name


def adapter_checks() -> dict:
    from draftsmith.data.tiny_models import random_model

    name = ta.register_tree_attention()  # "auto": the Triton kernel on CUDA
    calls: list[str] = []
    kernel = ta.tree_attention
    ta.tree_attention = lambda *a, **k: calls.append(k["backend"]) or kernel(*a, **k)
    out = {}
    try:
        for hidden in (64, 256):  # head dim 16 and 64
            for dtype in (torch.float32, torch.bfloat16):
                model = random_model("llama", hidden=hidden, max_positions=512).to(DEVICE, dtype)
                adapter = ModelAdapter(model)
                g = torch.Generator().manual_seed(1)
                prompt = torch.randint(4, 128, (1, 40), generator=g).to(DEVICE)
                tree = ta_tree(random_parents(12, seed=2)).to(DEVICE)
                ids = torch.randint(4, 128, (1, tree.shape[0]), generator=g).to(DEVICE)
                set_attention(model, "sdpa")
                calls.clear()
                base = adapter_tree_step(adapter, prompt, ids, tree)
                base_calls = len(calls)
                set_attention(model, name)
                got = adapter_tree_step(adapter, prompt, ids, tree)
                out[f"llama-h{hidden}-{str(dtype)[6:]}"] = errors(got, base) | {
                    "kernel_calls": calls.count("auto"), "kernel_calls_default_path": base_calls,
                    "layers": model.config.num_hidden_layers,
                    "argmax_agree": (got.argmax(-1) == base.argmax(-1)).float().mean().item()}
    finally:
        ta.tree_attention = kernel
    return out


# ------------------------------------------------------------------------------------------------ (c) timings
def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def bench(fn, reps: int) -> dict:
    for _ in range(10 if DEVICE == "cuda" else 1):
        fn()
    if DEVICE != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return {"median_us": None, "back_to_back_us": round((time.perf_counter() - t0) / reps * 1e6, 2)}
    torch.cuda.synchronize()
    single = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        single.append(start.elapsed_time(end) * 1e3)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return {"median_us": round(statistics.median(single), 2),
            "back_to_back_us": round((time.perf_counter() - t0) / reps * 1e6, 2)}


def timings_for(dtype: torch.dtype, reps: int) -> dict:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    ours = ALL_ATTENTION_FUNCTIONS[ta.register_tree_attention()]
    q, k, v, tree = smollm_like(dtype)
    t, s = tree.shape[0], k.shape[2]
    module = SimpleNamespace(num_key_value_groups=q.shape[1] // k.shape[1], is_causal=True, training=False)
    pos = torch.arange(s - t, s, device=DEVICE)  # any positions: no window
    mask = additive_mask(visibility(s - t, tree, pos), dtype)
    tree_kwarg = {ta.TREE_KWARG: tree}
    r = {"shape": {"B": q.shape[0], "Hq": q.shape[1], "Hkv": k.shape[1], "D": q.shape[-1], "T": t, "S": s}}
    for bt, bs in ((16, 32), (16, 64), (32, 64), (16, 128), (32, 32)):
        r[f"triton_t{bt}_s{bs}"] = bench(lambda bt=bt, bs=bs: triton_tree_attention(q, k, v, tree, 0.125, bt, bs),
                                         reps)
    r["reference"] = bench(lambda: ta.tree_attention_reference(q, k, v, tree, 0.125), reps)
    r["sdpa_4d_mask_hf"] = bench(lambda: sdpa(module, q, k, v, mask, scaling=0.125), reps)
    r["mask_build"] = bench(lambda: additive_mask(visibility(s - t, tree, pos), dtype), reps)
    r["registered_fn_kernel_path"] = bench(lambda: ours(module, q, k, v, mask, scaling=0.125, **tree_kwarg), reps)
    got = ours(module, q, k, v, mask, scaling=0.125, **tree_kwarg)[0]
    r["registered_vs_sdpa"] = errors(got, sdpa(module, q, k, v, mask, scaling=0.125)[0])
    return r


def timings(reps: int) -> dict:
    return {str(dtype)[6:]: timings_for(dtype, reps) for dtype in (torch.bfloat16, torch.float32)}


# ------------------------------------------------------------------------------------------------ (d) a 30-layer model
def model_for(model, dtype: torch.dtype, reps: int) -> dict:
    name = ta.register_tree_attention()
    model.to(dtype)
    adapter = ModelAdapter(model)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(4, 49152, (1, 300), generator=g).to(DEVICE)
    tree = ta_tree(random_parents(31, seed=4)).to(DEVICE)
    ids = torch.randint(4, 49152, (1, tree.shape[0]), generator=g).to(DEVICE)
    pos = 300 + tree.sum(1) - 1
    cache = adapter.new_cache(1024)

    def step():
        cache.crop(300)
        return adapter.forward(ids, cache, position_ids=pos, tree=tree).logits

    r, logits = {}, {}
    with torch.inference_mode():
        adapter.forward(prompt, cache, compute_logits=False)
        for impl in ("sdpa", name):
            set_attention(model, impl)
            calls: list[str] = []
            kernel = ta.tree_attention
            ta.tree_attention = lambda *a, **k: calls.append(k["backend"]) or kernel(*a, **k)  # noqa: B023
            try:
                logits[impl] = step()
            finally:
                ta.tree_attention = kernel
            r[f"kernel_calls_{impl}"] = len(calls)
            r[f"tree_step_{impl}"] = bench(step, max(reps // 4, 20))
    set_attention(model, "sdpa")
    r["logits"] = errors(logits[name], logits["sdpa"]) | {
        "argmax_agree": (logits[name].argmax(-1) == logits["sdpa"].argmax(-1)).float().mean().item()}
    return r


def smollm_model(reps: int) -> dict:
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = transformers.LlamaForCausalLM(config).eval()
    return {str(dtype)[6:]: model_for(model, dtype, reps) for dtype in (torch.float32, torch.bfloat16)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--skip-model", action="store_true", help="leave out (d), the 30-layer model")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --device cpu under TRITON_INTERPRET=1 for a dry run)")
    import transformers
    import triton

    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference in float32
    result = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (dry run)",
              "torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__}
    result["kernel"] = section(kernel_checks)
    result["adapter"] = section(adapter_checks)
    result["timing"] = section(lambda: timings(args.reps))
    if not args.skip_model:
        result["model"] = section(lambda: smollm_model(args.reps))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
