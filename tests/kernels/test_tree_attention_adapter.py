"""The tree attention registered in transformers' AttentionInterface and reached through ModelAdapter: the tree of
a tree step arrives as an attention keyword (through the decoder layer and the attention module), the kernel's
result equals the default 4-D-mask sdpa path, and everything else falls back to sdpa unchanged. In-process with
the PyTorch reference backend; the Triton kernel in the same place runs under the interpreter in
test_tree_attention.py."""

from __future__ import annotations

import pytest
import torch

from draftsmith.common.models import load_model
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.masks import causal_tree_mask
from draftsmith.kernels import tree_attention as module

REFERENCE = "draftsmith_tree_reference_test"
PARENTS = [-1, 0, 0, 1, 2, 2]  # draft tree below the pending token


def step_tree() -> tuple[torch.Tensor, torch.Tensor]:  # [T, T] with the pending token as row 0, positions
    tree = causal_tree_mask(PARENTS)
    full = torch.zeros(len(PARENTS) + 1, len(PARENTS) + 1, dtype=torch.bool)
    full[:, 0] = True
    full[1:, 1:] = tree
    return full, full.sum(1) - 1


def run(model, **forward_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill 9 tokens, then one tree step; both logits."""
    adapter = ModelAdapter(model)
    cache = adapter.new_cache()
    g = torch.Generator().manual_seed(0)
    prefill = adapter.forward(torch.randint(4, 128, (1, 9), generator=g), cache)
    tree, depth = step_tree()
    ids = torch.randint(4, 128, (1, tree.shape[0]), generator=g)
    step = adapter.forward(ids, cache, position_ids=9 + depth, tree=tree, **forward_kwargs)
    return prefill.logits, step.logits


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The backends of the tree kernel's calls (the attention function looks ``tree_attention`` up at call time)."""
    seen: list[str] = []
    kernel = module.tree_attention

    def spy(*args, **kwargs):
        seen.append(kwargs["backend"])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(module, "tree_attention", spy)
    return seen


def with_attention(family: str, name: str, **config):
    model = random_model(family, hidden=64, **config)
    model.set_attn_implementation(name)
    return model


@pytest.fixture(scope="module")
def reference_name() -> str:
    return module.register_tree_attention(REFERENCE, backend="reference")


def test_a_tree_step_runs_the_kernel_in_every_layer_and_equals_the_4d_mask_path(reference_name, calls):
    base = run(random_model("llama", hidden=64))
    got = run(with_attention("llama", reference_name))
    assert calls == ["reference"] * 3  # the tree step only: the prefill passed no tree
    assert torch.equal(got[0], base[0])  # prefill: sdpa itself
    torch.testing.assert_close(got[1], base[1], rtol=1e-5, atol=1e-5)


def test_sublayer_skips_pass_the_tree_too(reference_name, calls):
    base = run(random_model("llama", hidden=64), skip_mlp=[1], skip_attention=[2])
    got = run(with_attention("llama", reference_name), skip_mlp=[1], skip_attention=[2])
    assert calls == ["reference"] * 2  # layers 0 and 1 attend; layer 2 runs its MLP alone
    torch.testing.assert_close(got[1], base[1], rtol=1e-5, atol=1e-5)


def test_a_chain_after_a_cache_goes_to_sdpa_without_a_4d_mask(reference_name, calls):
    """No tree: the registered function hands the adapter's lower-right CausalBias to sdpa, as plain sdpa gets it."""
    outs = []
    for model in (random_model("llama", hidden=64), with_attention("llama", reference_name)):
        adapter = ModelAdapter(model)
        cache = adapter.new_cache()
        ids = torch.randint(4, 128, (1, 15), generator=torch.Generator().manual_seed(0))
        adapter.forward(ids[:, :9], cache)
        outs.append(adapter.forward(ids[:, 9:], cache).logits)
    assert calls == []
    assert torch.equal(outs[1], outs[0])


def test_sliding_window_layers_keep_the_4d_mask(reference_name, calls):
    base = run(random_model("mistral", hidden=64, max_positions=64))
    model = with_attention("mistral", reference_name, max_positions=64)
    assert model.config.sliding_window  # every layer has a window: the adapter passes no tree
    got = run(model)
    assert calls == []
    assert torch.equal(got[1], base[1])


def test_the_models_own_forward_is_sdpa(reference_name, calls):
    ids = torch.randint(4, 128, (2, 11), generator=torch.Generator().manual_seed(3))
    want = random_model("llama", hidden=64)(ids).logits
    assert torch.equal(with_attention("llama", reference_name)(ids).logits, want)  # sdpa's mask, sdpa's attention
    assert calls == []


def test_load_model_with_the_registered_default_is_the_4d_mask_path_on_cpu(tmp_path, calls):
    random_model("llama", hidden=64).save_pretrained(tmp_path / "m")
    model = load_model(tmp_path / "m", attn_implementation=module.register_tree_attention())
    assert model.config._attn_implementation == module.TREE_ATTENTION
    assert module.tree_attention_backend(module.TREE_ATTENTION) == "auto"
    got, base = run(model), run(load_model(tmp_path / "m"))
    assert calls == []  # auto: the kernel on CUDA only; CPU tensors go to sdpa with the adapter's mask
    assert torch.equal(got[0], base[0]) and torch.equal(got[1], base[1])


def test_registering_is_idempotent_and_never_replaces_another_function(reference_name):
    assert module.register_tree_attention(REFERENCE, backend="reference") == REFERENCE
    assert module.tree_attention_backend(REFERENCE) == "reference"
    assert module.tree_attention_backend("sdpa") is None and module.tree_attention_backend(None) is None
    with pytest.raises(ValueError, match="already registered with backend 'reference'"):
        module.register_tree_attention(REFERENCE, backend="auto")
    with pytest.raises(ValueError, match="already registered"):
        module.register_tree_attention("sdpa")
    with pytest.raises(ValueError, match="backend must be one of"):
        module.make_tree_attention_forward("cuda")
