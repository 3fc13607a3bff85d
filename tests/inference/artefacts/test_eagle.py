"""The EAGLE exports against the loaders' recorded contracts (tests/contracts/engines.json, copied from the engines'
source: config keys, tensor names, shapes, dtypes), and each export read back into draftsmith with identical draft
logits."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.artefacts.eagle import LLAMA_LAYER_KEYS, export_eagle, read_eagle_export
from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, draft_vocab

CONTRACTS = json.loads((Path(__file__).resolve().parents[2] / "contracts" / "engines.json").read_text())
ENGINES = {"eagle3": ("vllm_eagle3", "sglang_eagle3"), "vllm-eagle": ("vllm_eagle",), "sglang-eagle": ("sglang_eagle",)}


def _perturbed(head):
    torch.manual_seed(0)
    for p in head.parameters():
        p.data.add_(torch.randn_like(p) * 0.1)  # as if trained
    return head


def _head(fmt: str, layers: int = 6, aux=None, **eagle31):
    target = random_model("llama", seed=0, layers=layers)
    if fmt == "eagle3":
        d2t, t2d = draft_vocab(torch.arange(128).flip(0), 80)
        return target, _perturbed(Eagle3Head.for_target(target, d2t, t2d, aux, **eagle31))
    return target, _perturbed(EagleHead.for_target(target))


def _dims(target) -> dict[str, int]:
    c = target.config
    return {"H": c.hidden_size, "nh": c.num_attention_heads, "nkv": c.num_key_value_heads, "hd": c.head_dim,
            "I": c.intermediate_size, "V": c.vocab_size, "Vd": 80, "K": 3, "Ht": c.hidden_size}


def _shape(spec: str, dims: dict[str, int]) -> list[int] | None:
    """``[H, 2H]``, ``[nh*hd, H]``, ``[H, K*Ht]`` ... evaluated with ``dims`` (None when not a plain shape)."""
    m = re.match(r"^\s*\[([^\]]+)\]", spec.replace("·", "*"))
    if not m:
        return None
    try:
        return [int(eval(re.sub(r"(\d)([A-Za-z])", r"\1*\2", d.strip()), {}, dict(dims))) for d in m.group(1).split(",")]
    except (NameError, SyntaxError):
        return None


def _pattern(name: str) -> re.Pattern:
    name = re.escape(name).replace(r"\{i\}", r"\d+").replace(r"\{k\}", r"\d+")
    name = name.replace(r"\{q,k,v,o\}", "(q|k|v|o)").replace(r"\{q,k,v\}", "(q|k|v)")
    return re.compile("^" + name + "$")


@pytest.mark.parametrize("fmt", ["eagle3", "vllm-eagle", "sglang-eagle"])
def test_export_matches_every_engines_contract(fmt, tmp_path):
    target, head = _head(fmt)
    out = export_eagle(head, target.config, fmt, tmp_path / fmt)
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    dims = _dims(target)
    for engine in ENGINES[fmt]:
        contract = CONTRACTS[engine]
        assert config["architectures"][0] in contract["architectures"], engine
        assert config["model_type"] == contract["model_type"] and set(contract["config_keys_required"]) <= set(config)
        for key in ("bias", "norm_before_residual", "norm_before_fc", "norm_output"):
            assert key not in config  # keys whose meaning differs between the engines
        specs = {_pattern(n): s for n, s in contract["tensors"].items()}
        for name, tensor in tensors.items():
            matched = [s for p, s in specs.items() if p.match(name)]
            assert matched, f"{engine} does not know {name}"
            spec = matched[0]
            assert "FORBIDDEN" not in spec.get("note", ""), (engine, name)
            want = _shape(spec["shape"], dims)
            if want is not None:
                assert list(tensor.shape) == want, (engine, name, spec["shape"])
            assert (tensor.dtype == torch.int64) if name == "d2t" else (tensor.dtype == torch.bool) if name == "t2d" \
                else tensor.dtype.is_floating_point
        required = {n for n, s in contract["tensors"].items() if s.get("required") is True and "{" not in n}
        required -= {"fc.bias"} if fmt == "eagle3" else set()  # fc.bias: only with SGLang's `bias: true`
        assert required <= set(tensors), (engine, required - set(tensors))
    if fmt == "vllm-eagle":
        assert "fc.bias" not in tensors and "layers.0.input_layernorm.weight" not in tensors
    if fmt == "sglang-eagle":
        assert torch.equal(tensors["fc.bias"], torch.zeros(32))
    if fmt == "eagle3":
        assert config["draft_vocab_size"] == 80
        assert config["eagle_aux_hidden_state_layer_ids"] == sorted(head.hidden_layers)
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [
            i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]]  # written even for the engines' defaults
        assert not any(k.startswith("embed_tokens") for k in tensors)


@pytest.mark.parametrize("fmt", ["eagle3", "vllm-eagle", "sglang-eagle"])
def test_round_trip_gives_identical_draft_logits(fmt, tmp_path):
    target, head = _head(fmt)
    back = read_eagle_export(export_eagle(head, target.config, fmt, tmp_path / fmt), target)
    torch.manual_seed(1)
    e, pos = torch.randn(1, 5, 32), torch.arange(5)[None]
    g = torch.randn(1, 5, 32) if fmt != "eagle3" else head.fuse({i: torch.randn(1, 5, 32) for i in head.hidden_layers})
    lm = target.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(back.draft_logits(back(e, g, pos), lm), head.draft_logits(head(e, g, pos), lm))


def test_non_default_layers_are_written_in_both_conventions(tmp_path):
    target, head = _head("eagle3", layers=8, aux=(1, 4, 6))
    config = json.loads((export_eagle(head, target.config, "eagle3", tmp_path / "e") / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]  # vLLM: the hidden-state index
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 3, 5]  # SGLang: the output of layer id
    assert read_eagle_export(tmp_path / "e", target).hidden_layers == (1, 4, 6)


@pytest.mark.parametrize("depth", [4, 5])
def test_shallow_targets_get_their_layer_ids_written(depth, tmp_path):
    """An engine's default (2, n//2, n-3) collides below 6 layers: the export must name the head's own layers."""
    target, head = _head("eagle3", layers=depth)
    config = json.loads((export_eagle(head, target.config, "eagle3", tmp_path / "e") / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == list(head.hidden_layers) == sorted(set(head.hidden_layers))


def test_layers_out_of_order_are_written_ascending_with_fc_permuted(tmp_path):
    target, head = _head("eagle3", layers=8, aux=(6, 1, 4))
    export = export_eagle(head, target.config, "eagle3", tmp_path / "e")
    assert json.loads((export / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]
    back = read_eagle_export(export, target)
    assert back.hidden_layers == (1, 4, 6)
    features = {i: torch.randn(1, 5, 32) for i in (1, 4, 6)}
    with torch.no_grad():  # the same fused features whichever order the layers are listed in
        assert torch.allclose(back.fuse(features), head.fuse(features), atol=1e-6)


def test_a_full_vocabulary_head_ships_no_vocabulary_map(tmp_path):
    target = random_model("llama", seed=0, layers=6)
    vocab = target.config.vocab_size
    head = _perturbed(Eagle3Head.for_target(target, torch.zeros(vocab, dtype=torch.long),
                                            torch.ones(vocab, dtype=torch.bool), None))
    export = export_eagle(head, target.config, "eagle3", tmp_path / "e")
    tensors = load_file(str(export / "model.safetensors"))
    assert "d2t" not in tensors and "t2d" not in tensors
    assert json.loads((export / "config.json").read_text())["draft_vocab_size"] == vocab
    back = read_eagle_export(export, target)
    e, g, pos = torch.randn(1, 5, 32), head.fuse({i: torch.randn(1, 5, 32) for i in head.hidden_layers}), torch.arange(5)[None]
    lm = target.get_output_embeddings()
    with torch.no_grad():
        assert torch.equal(back.draft_logits(back(e, g, pos), lm), head.draft_logits(head(e, g, pos), lm))


def test_wrong_format_for_the_head_is_refused(tmp_path):
    target, head = _head("vllm-eagle")
    with pytest.raises(ConfigError, match="eagle3"):
        export_eagle(head, target.config, "eagle3", tmp_path / "x")
    import transformers

    from draftsmith.data.tiny_models import tiny_config

    config = tiny_config("llama", layers=6)
    config.attention_bias = True  # a layer with attention biases of its own
    own = transformers.AutoModelForCausalLM.from_config(config).eval()
    biased = EagleHead.for_target(own, fc_bias=True, layer="target")  # the target's own (biased) layer
    with pytest.raises(ConfigError, match="attention biases of its own.*sglang-eagle"):
        export_eagle(biased, own.config, "vllm-eagle", tmp_path / "y")


def test_an_fc_bias_folds_exactly_into_the_attention_biases_vllm_loads(tmp_path):
    """vLLM's EAGLE-1 fc has no bias (EAGLE-1's reference head has one): the vllm-eagle export writes ``bias: true``
    and the fc bias b as q/k/v biases W b and o_proj's bias b, which a biased-attention layer reading the fc output
    without b turns into the same features; read back, the head is the trained one."""
    from draftsmith.inference.drafters.eagle import head_config

    target = random_model("llama", seed=0, layers=6)
    head = _perturbed(EagleHead.for_target(target, fc_bias=True))
    out = export_eagle(head, target.config, "vllm-eagle", tmp_path / "v")
    config = json.loads((out / "config.json").read_text())
    tensors = load_file(str(out / "model.safetensors"))
    b = head.fc.bias.detach()
    assert config["bias"] is True and "fc.bias" not in tensors
    attention = {n: tensors[f"layers.0.self_attn.{n}_proj.bias"] for n in "qkvo"}
    assert torch.equal(attention["o"], b)
    assert torch.allclose(attention["q"], head.layer.self_attn.q_proj.weight.detach() @ b, atol=1e-6)
    specs = {_pattern(n): spec for n, spec in CONTRACTS["vllm_eagle"]["tensors"].items()}
    assert all(any(p.match(name) for p in specs) for name in tensors)  # every name one vLLM's loader knows
    # vLLM's computation: fc without bias, then the layer with the q/k/v/o biases `bias: true` creates
    served_config = head_config(target.config)
    served_config.attention_bias = True
    served = EagleHead(served_config, type(head.layer), type(head.rotary), fc_bias=False)
    served.load_state_dict({("layer." + k.removeprefix("layers.0.")) if k.startswith("layers.0.") else k: v
                            for k, v in tensors.items()})
    torch.manual_seed(1)
    e, f, pos = torch.randn(1, 5, 32), torch.randn(1, 5, 32), torch.arange(5)[None]
    with torch.no_grad():
        assert torch.allclose(served(e, f, pos), head(e, f, pos), atol=1e-5)
    back = read_eagle_export(out, target)
    assert back.fc_bias and all(torch.equal(v, back.state_dict()[k]) for k, v in head.state_dict().items())


def _family_target(family: str):
    import transformers

    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config, "gemma": transformers.GemmaConfig,
           "gemma3": transformers.Gemma3TextConfig, "olmo2": transformers.Olmo2Config,
           "mistral": transformers.MistralConfig}[family]
    extra = {"sliding_window": 8, "query_pre_attn_scalar": 8} if family == "gemma3" else {}
    config = cls(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=256, eos_token_id=2, pad_token_id=0, **extra)
    torch.manual_seed(0)
    target = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from their initial values, so a wrong parametrisation shows
        for name, param in target.named_parameters():
            if "norm" in name:
                param.add_(0.1 * torch.randn_like(param))
    return target


def _family_head(family: str, fmt: str, layer: str = "llama"):
    target = _family_target(family)
    if fmt == "eagle3":
        d2t, t2d = draft_vocab(torch.arange(128).flip(0), 80)
        return target, Eagle3Head.for_target(target, d2t, t2d, None, layer=layer)
    return target, EagleHead.for_target(target, layer=layer)


@pytest.mark.parametrize("family, named", [("qwen2", "q_proj.bias"), ("qwen3", "q_norm"), ("olmo2", "q_norm"),
                                           ("gemma", "Gemma's"), ("gemma3", "post_feedforward_layernorm")])
@pytest.mark.parametrize("fmt", ["eagle3", "vllm-eagle"])
def test_heads_built_on_a_non_llama_layer_are_refused_naming_what_llama_layers_lack(family, named, fmt, tmp_path):
    target, head = _family_head(family, fmt, layer="target")
    with pytest.raises(ConfigError, match=named):
        export_eagle(head, target.config, fmt, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "olmo2", "gemma", "gemma3", "mistral"])
@pytest.mark.parametrize("fmt", ["eagle3", "vllm-eagle"])
def test_every_familys_head_is_a_llama_layer_the_engines_load_and_drafts_the_same_read_back(family, fmt, tmp_path):
    """The default head layer is Llama's of the target's shape and rope (what vLLM and SGLang build): it exports
    for every family, its export holds Llama's keys only, and read back it computes what the head computes."""
    from draftsmith.inference.drafters.eagle import norm_scale

    target, head = _family_head(family, fmt)
    assert type(head.midlayer if fmt == "eagle3" else head.layer).__name__ == "LlamaDecoderLayer"
    text = target.config.get_text_config()
    assert head.config.head_dim == 8 and head.config.num_key_value_heads == 2 and head.config.hidden_act == "silu"
    rope = text.rope_parameters.get("full_attention", text.rope_parameters)
    assert head.config.rope_parameters["rope_theta"] == rope["rope_theta"]
    out = export_eagle(head, target.config, fmt, tmp_path / "x")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["head_dim"] == 8
    tensors = load_file(str(out / "model.safetensors"))
    layer_keys = {k.removeprefix("midlayer.").removeprefix("layers.0.") for k in tensors
                  if k.startswith(("midlayer.", "layers.0."))}
    assert layer_keys <= LLAMA_LAYER_KEYS | {"hidden_norm.weight"}, layer_keys - LLAMA_LAYER_KEYS
    back = read_eagle_export(out, target)
    torch.manual_seed(1)
    if fmt == "eagle3":
        assert torch.allclose(head.norm.weight, norm_scale(target.model.norm, 32).to(head.norm.weight.dtype),
                              atol=1e-6)  # the target's final norm's scale, whatever its parametrisation
        feats = {i: torch.randn(1, 5, 32) for i in head.hidden_layers}
        e, pos = torch.randn(1, 5, 32), torch.arange(5)[None]
        with torch.no_grad():
            assert torch.allclose(back(e, back.fuse(feats), pos), head(e, head.fuse(feats), pos), atol=1e-5)
    else:
        e, f, pos = torch.randn(1, 5, 32), torch.randn(1, 5, 32), torch.arange(5)[None]
        with torch.no_grad():
            assert torch.allclose(back(e, f, pos), head(e, f, pos), atol=1e-5)


def test_the_speculators_layout_carries_the_eagle3_head_and_reads_back(tmp_path):
    target, head = _head("eagle3", layers=8, aux=(1, 4, 6))
    out = export_eagle(head, target.config, "speculators", tmp_path / "s", speculative_tokens=4)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 80
    assert config["norm_before_residual"] is False  # the layout's default (true) is not draftsmith's head
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["transformer_layer_config"]["num_hidden_layers"] == 1
    assert set(load_file(str(out / "model.safetensors"))) == set(
        load_file(str(export_eagle(head, target.config, "eagle3", tmp_path / "e") / "model.safetensors")))
    back = read_eagle_export(out, target)
    assert back.hidden_layers == (1, 4, 6)


@pytest.mark.parametrize("fmt", ["eagle3", "speculators"])
def test_eagle31_heads_export_their_switches_and_norms_in_ascending_order(fmt, tmp_path):
    """EAGLE-3.1: fc_norm and norm_output (and the normed residual, norm_before_residual) written as vLLM reads them
    (top level, only where on), one fc norm per fused layer in ascending layer order like fc's columns, and the
    read-back head computes what the trained one does (fused features, feedback and logits)."""
    target, head = _head("eagle3", layers=8, aux=(6, 1, 4), fc_norm=True, norm_output=True, norm_before_residual=True)
    export = export_eagle(head, target.config, fmt, tmp_path / fmt)
    config = json.loads((export / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True and config["norm_before_residual"] is True
    tensors = load_file(str(export / "model.safetensors"))
    order = {layer: i for i, layer in enumerate(head.hidden_layers)}
    for n, layer in enumerate((1, 4, 6)):
        assert torch.equal(tensors[f"fc_norm.{n}.weight"], head.fc_norm[order[layer]].weight.detach())
    back = read_eagle_export(export, target)
    assert back.fc_norm is not None and back.norm_output and back.norm_before_residual
    features = {i: torch.randn(1, 5, 32) for i in (1, 4, 6)}
    e, pos, lm = torch.randn(1, 5, 32), torch.arange(5)[None], target.get_output_embeddings()
    with torch.no_grad():
        g, g_back = head.fuse(features), back.fuse(features)
        assert torch.allclose(g_back, g, atol=1e-6)
        assert torch.allclose(back.draft_logits(back(e, g_back, pos), lm), head.draft_logits(head(e, g, pos), lm),
                              atol=1e-5)
    other, plain_head = _head("eagle3")
    plain = json.loads((export_eagle(plain_head, other.config, fmt, tmp_path / "plain") / "config.json").read_text())
    assert "fc_norm" not in plain and "norm_output" not in plain
    assert plain.get("norm_before_residual", False) is False  # the speculators layout writes it out, false
