"""EAGLE's artefact: the head of a ``heads`` artefact directory (:func:`load_eagle_head`), and exporting EAGLE heads to the layouts vLLM and SGLang load (docs/EXPORT.md; the contracts are recorded from the
engines' loaders in tests/contracts/engines.json), and reading an export back into draftsmith.

- ``eagle3``: one directory both engines load (the portable layout): ``config.json`` with
  ``architectures: ["LlamaForCausalLMEagle3"]``, ``model_type: "llama"``, one layer, the head's layer sizes, the
  target's ``vocab_size`` and the ``draft_vocab_size``; ``model.safetensors`` with ``midlayer.*``, ``fc.weight``
  ``[H, 3 Ht]``, ``norm.weight``, ``lm_head.weight`` ``[Vd, H]``, ``d2t`` ``[Vd]`` int64 and ``t2d`` ``[V]`` bool; no
  embedding (both engines share the target's). The three target layers are always written, in ascending order
  (``fc``'s column blocks permuted to match), in both conventions: ``eagle_config.eagle_aux_hidden_state_layer_ids``
  in SGLang's (the *output* of layer ``id``: hidden-state index minus one) and the top-level key in vLLM's (the
  hidden-state index itself), which vLLM prefers; an engine's own default ``(2, n//2, n-3)`` would feed a head
  trained on a shallow target other layers. A head drafting over the full vocabulary ships no ``d2t``/``t2d``
  (vLLM builds no vocabulary map then and refuses the tensors).
- ``vllm-eagle`` / ``sglang-eagle`` (EAGLE-1; the engines disagree, so there are two): ``fc.weight`` ``[H, 2H]`` and
  ``layers.0.*`` without ``input_layernorm`` (identity in both engines, as in draftsmith's head). vLLM:
  ``architectures: ["LlamaForCausalLM"]`` (vLLM renames it ``EagleLlamaForCausalLM``) and no ``fc.bias`` (its ``fc``
  has none, and its loader raises on one): a head trained with an fc bias (the default, as EAGLE-1's reference) has
  it folded, exactly, into the layer's attention biases, with ``bias: true``, which makes vLLM's layer create them
  (:func:`fold_fc_bias`); SGLang: ``["LlamaForCausalLMEagle"]`` and an ``fc.bias`` always (zeros for a head trained
  without one: SGLang's ``fc`` has a bias and would keep it randomly initialised otherwise).

Keys the engines read differently are never written (``norm_before_fc``; ``bias``, an fc bias in SGLang and q/k/v/o
biases in vLLM, only in the vllm-eagle layout of a folded fc bias). EAGLE-3.1's ``fc_norm`` and ``norm_output``, and
``norm_before_residual`` (:func:`eagle31_keys`), are written only for a head trained with them: vLLM's EAGLE-3 model
reads all three (0.32), an engine that does not would serve such a head wrongly — SGLang (2026-07) ignores
``norm_before_residual``, so such a head is for vLLM.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from draftsmith.common.errors import ArtefactError, ConfigError
from draftsmith.common.io import read_json
from draftsmith.inference.artefacts.checkpoint import write_export
from draftsmith.inference.artefacts.reader import config_misfit, read_weights
from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, aux_layers
from draftsmith.inference.drafters.peagle import PEagleHead

EAGLE_FORMATS = ("eagle3", "vllm-eagle", "sglang-eagle", "speculators")
SPECULATORS_VERSION = "0.9.0"  # vllm-project/speculators' checkpoint layout, which vLLM loads natively
ARCHITECTURES = {"eagle3": "LlamaForCausalLMEagle3", "vllm-eagle": "LlamaForCausalLM",
                 "sglang-eagle": "LlamaForCausalLMEagle"}
_LAYER_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "hidden_act", "rms_norm_eps", "max_position_embeddings", "rope_parameters", "rope_scaling", "mlp_bias")


def layer_config(head, target_config, fmt: str) -> dict:
    """The export's ``config.json``: the head layer's sizes (from the target's config) and the format's keys."""
    source = head.config.to_dict()
    config = {"architectures": [ARCHITECTURES[fmt]], "model_type": "llama", "num_hidden_layers": 1,
              "vocab_size": int(target_config.vocab_size), "tie_word_embeddings": False}
    config.update({k: source[k] for k in _LAYER_KEYS if source.get(k) is not None})
    rope = source.get("rope_parameters") or {}
    theta = rope.get("rope_theta", source.get("rope_theta"))
    if theta is not None:
        config["rope_theta"] = theta
    config["rope_scaling"] = source.get("rope_scaling")
    config["torch_dtype"] = str(next(head.parameters()).dtype).removeprefix("torch.")
    if fmt == "vllm-eagle" and getattr(head, "fc_bias", False):
        config["bias"] = True  # vLLM's layer then has q/k/v/o biases: the folded fc bias (fold_fc_bias)
    if fmt == "eagle3":
        config["draft_vocab_size"] = int(head.d2t.numel())
        if head.target_hidden != head.hidden:
            config["target_hidden_size"] = head.target_hidden
        layers = sorted(head.hidden_layers)  # the engines concatenate the captured layers in ascending order
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}  # SGLang's ids
        config["eagle_aux_hidden_state_layer_ids"] = layers  # vLLM's (preferred there); written for every depth
        if isinstance(head, PEagleHead):  # vLLM's parallel drafting reads the placeholder token from here
            config["mask_token_id"] = config["pard_token"] = head.mask_token_id
        config |= eagle31_keys(head)
    return config


def eagle31_keys(head) -> dict:
    """EAGLE-3.1's switches as vLLM's EAGLE-3 model (and the speculators layout) read them, only where on: ``fc_norm``
    (an RMSNorm per fused layer, ``fc_norm.{i}.weight`` in ascending layer order), ``norm_output`` (the normed
    output fed back) and ``norm_before_residual`` (the normed input as the residual; vLLM only)."""
    return {k: True for k, on in (("fc_norm", getattr(head, "fc_norm", None) is not None),
                                  ("norm_output", getattr(head, "norm_output", False)),
                                  ("norm_before_residual", getattr(head, "norm_before_residual", False))) if on}


def ascending_fc(fc: torch.Tensor, layers: tuple[int, ...]) -> torch.Tensor:  # [H, k Ht] -> [H, k Ht]
    """EAGLE-3's ``fc`` weight with its per-layer column blocks in ascending layer order: the engines concatenate
    the captured hidden states that way, whatever order the head was trained with."""
    blocks = fc.chunk(len(layers), dim=-1)  # k x [H, Ht], in the head's order
    return torch.cat([blocks[i] for i in sorted(range(len(layers)), key=lambda i: layers[i])], dim=-1)


def eagle_tensors(head, fmt: str) -> dict[str, torch.Tensor]:
    """The head's tensors under the names of ``fmt`` (module docstring)."""
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    if fmt == "eagle3":
        if not isinstance(head, Eagle3Head):
            raise ConfigError("--format eagle3 exports EAGLE-3 heads; this artefact is EAGLE-1: use vllm-eagle or "
                              "sglang-eagle")
        state["fc.weight"] = ascending_fc(state["fc.weight"], head.hidden_layers)
        if "mask_hidden" in state:  # P-EAGLE's placeholder lives in the same concatenated feature space as fc's input
            state["mask_hidden"] = ascending_fc(state["mask_hidden"][None], head.hidden_layers)[0]
        order = sorted(range(len(head.hidden_layers)), key=lambda i: head.hidden_layers[i])
        norms = {i: state.pop(f"fc_norm.{i}.weight") for i in range(len(head.hidden_layers))
                 if f"fc_norm.{i}.weight" in state}
        state |= {f"fc_norm.{n}.weight": norms[i] for n, i in enumerate(order) if i in norms}  # EAGLE-3.1, ascending
        if head.d2t.numel() == head.t2d.numel():  # the full vocabulary: vLLM has no vocabulary map to load then
            del state["d2t"], state["t2d"]
        return state
    if not isinstance(head, EagleHead):
        raise ConfigError(f"--format {fmt} exports EAGLE-1 heads; this artefact is EAGLE-3: use --format eagle3")
    out = {("layers.0." + k.removeprefix("layer.")) if k.startswith("layer.") else k: v for k, v in state.items()}
    if fmt == "vllm-eagle" and "fc.bias" in out:
        out = fold_fc_bias(out)
    if fmt == "sglang-eagle" and "fc.bias" not in out:
        out["fc.bias"] = torch.zeros(head.hidden, dtype=out["fc.weight"].dtype)
    return out


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def fold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """EAGLE-1 tensors (``vllm-eagle`` names) with ``fc.bias`` ``b`` folded into the layer's attention biases, for
    vLLM's EAGLE-1 model, whose ``fc`` has no bias and whose layer has q/k/v/o biases under ``bias: true``. Exact: the
    layer reads ``h = W x + b`` with no input norm, so ``q/k/v = W_{q,k,v} (W x) + W_{q,k,v} b`` (their biases), and
    ``b``'s share of the residual stream joins the attention output as ``o_proj``'s bias (computed in float32, stored
    in the weights' dtype). :func:`unfold_fc_bias` undoes it."""
    out = dict(tensors)
    taken = [n for n in ATTENTION if f"layers.0.self_attn.{n}.bias" in out]
    if taken:
        raise ConfigError(f"this EAGLE-1 head's layer has attention biases of its own ({', '.join(taken)}), so its fc "
                          "bias cannot be folded into them for vLLM: export --format sglang-eagle")
    b = out.pop("fc.bias")  # [H]
    for name in ATTENTION[:3]:
        weight = out[f"layers.0.self_attn.{name}.weight"]  # [out, H]
        out[f"layers.0.self_attn.{name}.bias"] = (weight.float() @ b.float()).to(weight.dtype)  # [out]
    out["layers.0.self_attn.o_proj.bias"] = b.clone()
    return out


def unfold_fc_bias(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`fold_fc_bias` undone: ``fc.bias`` back from ``o_proj``'s bias, the attention biases dropped."""
    out = {k: v for k, v in tensors.items() if k not in {f"layers.0.self_attn.{n}.bias" for n in ATTENTION}}
    out["fc.bias"] = tensors["layers.0.self_attn.o_proj.bias"]
    return out


PORTABLE_FAMILIES = ("llama", "mistral")  # targets whose decoder layer is Llama's, key for key and in meaning
# what a Llama layer (the engines' EAGLE layer) lacks of other families' layers
LLAMA_LACKS = {"gemma": "Gemma's (1 + weight) RMS norms, GELU-tanh MLP and scaled embeddings",
               "gemma2": "Gemma's (1 + weight) RMS norms, soft-capping and extra norms",
               "gemma3": "Gemma's (1 + weight) RMS norms, q/k norms and extra norms"}
LLAMA_LAYER_KEYS = {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                    "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                    "input_layernorm.weight", "post_attention_layernorm.weight"}


def check_portable(head) -> None:
    """Refuse, in one line, a head whose decoder layer the engines would load as a Llama layer wrongly: one built as
    the layer of a target family other than Llama/Mistral (``layer: target``; Qwen2's q/k/v biases, Qwen3's and OLMo2's
    q/k norms, Gemma's norms and activation) would load with parameters dropped, or draft with other math, and accept
    nearly nothing. A head with the Llama layer (the default, for every family) passes."""
    family = str(getattr(head.config, "model_type", ""))
    if family in PORTABLE_FAMILIES:
        return
    layer = [k.split(".", 1)[1] for k in head.state_dict() if k.startswith(("layer.", "midlayer."))]
    extra = sorted(k for k in layer if k not in LLAMA_LAYER_KEYS | {"hidden_norm.weight"})  # EAGLE-3's own norm
    lacks = LLAMA_LACKS.get(family) or (", ".join(extra) if extra else f"{family}'s own layer math")
    raise ConfigError(f"this EAGLE head has a {family} decoder layer, but vLLM and SGLang load EAGLE heads as Llama "
                      f"layers, which lack {lacks}: the export would draft wrongly, so it is refused; evaluate the "
                      "head in draftsmith (`draftsmith eval --artefact`), or train it with the Llama layer "
                      "(head_layer=llama, the default)")


def speculators_config(head, target_config, speculative_tokens: int = 5) -> dict:
    """The speculators layout's ``config.json`` of an EAGLE-3 head: the eagle3 export's layer config as the
    ``transformer_layer_config``, the EAGLE-3 keys at the top level with ``norm_before_residual`` always written out
    (the layout's default is true; draftsmith's head adds the un-normed hidden state as the residual unless trained
    with it), and the ``speculators_config`` block vLLM reads the method and draft length from."""
    layer = layer_config(head, target_config, "eagle3")
    top = {k: layer.pop(k) for k in ("draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids",
                                     "fc_norm", "norm_output", "norm_before_residual") if k in layer}
    layer.pop("eagle_config", None)
    layer["architectures"] = ["LlamaForCausalLM"]
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "speculators_version": SPECULATORS_VERSION, "transformer_layer_config": layer, **top,
            "norm_before_residual": bool(top.pop("norm_before_residual", False)), "norm_before_fc": False,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy",
                                                         "speculative_tokens": int(speculative_tokens)}],
                                   "verifier": {"name_or_path": str(getattr(target_config, "_name_or_path", "")),
                                                "architectures": list(getattr(target_config, "architectures", None)
                                                                      or [])}}}


def export_eagle(head, target_config, fmt: str, out: str | os.PathLike, speculative_tokens: int = 5) -> Path:
    """Write ``head`` in layout ``fmt`` at ``out``, atomically (refused for heads the engines cannot load right:
    :func:`check_portable`). ``speculative_tokens``: the draft length the speculators layout records."""
    if fmt not in EAGLE_FORMATS:
        raise ConfigError(f"EAGLE export format {fmt!r} is unknown: choose one of {', '.join(EAGLE_FORMATS)}")
    check_portable(head)
    if fmt == "speculators" and not isinstance(head, Eagle3Head):
        raise ConfigError("--format speculators exports EAGLE-3 heads; this artefact is EAGLE-1: use vllm-eagle or "
                          "sglang-eagle")
    if fmt == "speculators" and isinstance(head, PEagleHead):
        raise ConfigError("a P-EAGLE head exports as --format eagle3 (vLLM serves it as method eagle3 with "
                          "parallel_drafting); the speculators layout written here holds EAGLE-3 heads")
    if fmt == "speculators":
        return write_export(out, eagle_tensors(head, "eagle3"), speculators_config(head, target_config,
                                                                                 speculative_tokens), fmt)
    return write_export(out, eagle_tensors(head, fmt), layer_config(head, target_config, fmt), fmt)


def read_eagle_export(directory: str | os.PathLike, target) -> EagleHead | Eagle3Head:
    """An export (any of :data:`EAGLE_FORMATS`) back as a draftsmith head for ``target``."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    config = config if isinstance(config, dict) else {}
    if config.get("speculators_model_type") == "eagle3":  # the speculators layout
        config = {**config, "architectures": [ARCHITECTURES["eagle3"]]}
    arch = (config.get("architectures") or [None])[0]
    if arch not in ARCHITECTURES.values():
        raise ArtefactError(f"{directory} is not an EAGLE export (config.json architectures {arch!r})")
    tensors = read_weights(directory / "model.safetensors")
    if arch == ARCHITECTURES["eagle3"]:
        layers = config.get("eagle_aux_hidden_state_layer_ids") or aux_layers(int(target.config.num_hidden_layers))
        if "d2t" not in tensors:  # a full-vocabulary head: the identity map
            vocab = int(target.config.vocab_size)
            tensors |= {"d2t": torch.zeros(vocab, dtype=torch.long), "t2d": torch.ones(vocab, dtype=torch.bool)}
        v31 = {"fc_norm": bool(config.get("fc_norm")), "norm_output": bool(config.get("norm_output")),
               "norm_before_residual": bool(config.get("norm_before_residual"))}
        if "mask_hidden" in tensors:  # P-EAGLE, its placeholder in the export's (ascending) layer order
            head = PEagleHead.for_target(target, tensors["d2t"], tensors["t2d"], tuple(layers),
                                         mask_token_id=int(config["mask_token_id"]), **v31)
        else:
            head = Eagle3Head.for_target(target, tensors["d2t"], tensors["t2d"], tuple(layers), **v31)
        head.load_state_dict(tensors)
        return head
    if arch == ARCHITECTURES["vllm-eagle"] and config.get("bias") and "fc.bias" not in tensors:
        tensors = unfold_fc_bias(tensors)  # draftsmith's fold of an fc bias
    head = EagleHead.for_target(target, fc_bias="fc.bias" in tensors)
    state = {("layer." + k.removeprefix("layers.0.")) if k.startswith("layers.0.") else k: v for k, v in tensors.items()}
    head.load_state_dict(state)
    return head


def load_eagle_head(directory, target: torch.nn.Module) -> EagleHead | Eagle3Head:
    """The head of an EAGLE artefact directory (``heads.safetensors`` + ``heads_config.json``) for ``target``."""
    directory = Path(directory)
    config = read_json(directory / "heads_config.json")
    if not isinstance(config, dict) or config.get("method") != "eagle":
        raise ArtefactError(f"{directory}/heads_config.json is missing or not an EAGLE head: pass an EAGLE artefact")
    tensors = read_weights(directory / "heads.safetensors")
    try:
        v31 = {"fc_norm": bool(config.get("fc_norm", False)), "norm_output": bool(config.get("norm_output", False)),
               "layer": str(config.get("layer", "target")),  # heads written before the Llama layer: the target's
               "norm_before_residual": bool(config.get("norm_before_residual", False))}
        if config.get("variant", "eagle1") == "peagle":
            head = PEagleHead.for_target(target, tensors["d2t"], tensors["t2d"], tuple(config["layers"]),
                                         mask_token_id=int(config["mask_token_id"]), **v31)
        elif config.get("variant", "eagle1") == "eagle3":
            head = Eagle3Head.for_target(target, tensors["d2t"], tensors["t2d"], tuple(config["layers"]), **v31)
        else:
            head = EagleHead.for_target(target, fc_bias=bool(config.get("fc_bias", False)), layer=v31["layer"])
        head.load_state_dict(tensors)
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        raise config_misfit(directory / "heads_config.json", err) from None
    return head


def export_eagle_artefact(artefact: str | os.PathLike, manifest: dict, fmt: str, out: str | os.PathLike,
                          target_model=None) -> Path:
    """Export an EAGLE artefact in layout ``fmt`` (:data:`EAGLE_FORMATS`); the head's layer is built from the
    target's config, so the target is needed."""
    if target_model is None:
        raise ConfigError(f"--format {fmt} builds the head's layer from its target's config: pass --target")
    return export_eagle(load_eagle_head(artefact, target_model), target_model.config, fmt, out)


__all__ = ["ARCHITECTURES", "EAGLE_FORMATS", "eagle_tensors", "export_eagle", "export_eagle_artefact", "fold_fc_bias",
           "layer_config", "load_eagle_head", "read_eagle_export", "ascending_fc", "check_portable", "speculators_config",
           "unfold_fc_bias"]
