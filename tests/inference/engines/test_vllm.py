"""How each method runs in vLLM: the speculative config, the export it needs, and draftsmith's matching chain."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.common.errors import ConfigError
from draftsmith.data.tiny_models import random_model
from draftsmith.inference.drafters.eagle import Eagle3Head, aux_layers, draft_vocab
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.inference.engines.vllm import EngineSetup
from draftsmith.inference.methods.draft_model import vllm_engine as draft_model
from draftsmith.inference.methods.eagle import vllm_engine as eagle
from draftsmith.inference.methods.medusa import vllm_engine as medusa
from draftsmith.inference.methods.prompt_lookup import vllm_engine as ngram


def _artefact(path, module):
    path.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path / "heads.safetensors"))
    (path / "heads_config.json").write_text(json.dumps(module.artefact_config()))
    return path


def test_prompt_lookup_runs_as_ngram_with_the_same_bounds_and_a_fixed_chain(tmp_path):
    m = ngram(EngineSetup("pld", None, tmp_path, None, options={"pld_max_ngram": 3, "pld_min_ngram": None}))
    assert m.speculative_config == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
                                    "prompt_lookup_max": 3}
    assert m.draftsmith_options["pld_length"] == "fixed" and m.draftsmith_options["pld_tokens"] == 5


def test_a_draft_model_is_served_from_the_artefacts_draft_directory(tmp_path):
    m = draft_model(EngineSetup("distillspec", 3, tmp_path, None, artefact_dir=tmp_path / "a",
                                manifest={"proposer": {"model_dir": "draft"}}))
    assert m.speculative_config == {"method": "draft_model", "model": str(tmp_path / "a" / "draft"),
                                    "num_speculative_tokens": 3}
    assert m.draftsmith_options["confidence_threshold"] == 0.0  # the engine never stops a draft early
    with pytest.raises(ConfigError, match="--draft PATH"):
        draft_model(EngineSetup("draft", 3, tmp_path, None))


def test_an_eagle3_head_is_exported_with_its_layers_for_vllms_eagle3(tmp_path):
    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128).flip(0), 80)
    art = _artefact(tmp_path / "art", Eagle3Head.for_target(target, d2t, t2d, None))
    m = eagle(EngineSetup("eagle", None, tmp_path / "x", target, artefact_dir=art))
    assert m.speculative_config["method"] == "eagle3" and m.speculative_config["num_speculative_tokens"] == 5
    config = json.loads((tmp_path / "x" / "eagle3" / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == list(aux_layers(4))  # a 4-layer target: written
    assert m.draftsmith_options == {"tree": "chain", "draft_length": 5}
    with pytest.raises(ConfigError, match="--artefact"):
        eagle(EngineSetup("eagle", None, tmp_path / "y", target))


def test_medusa_drafts_at_most_its_heads_and_draftsmith_drafts_the_same_chain(tmp_path):
    target = random_model("llama", seed=0, layers=2)
    heads = MedusaHeads(hidden=target.config.hidden_size, vocab=target.config.vocab_size, heads=3)
    art = _artefact(tmp_path / "art", heads)
    m = medusa(EngineSetup("medusa", None, tmp_path, target, artefact_dir=art, manifest={}))
    assert m.speculative_config["num_speculative_tokens"] == 3 and m.served_model is None
    assert json.loads(open(m.draftsmith_options["tree"]).read()) == [[0], [0, 0], [0, 0, 0]]
    assert "lm_head.weight" in load_file(str(tmp_path / "medusa" / "model.safetensors"))
    with pytest.raises(ConfigError, match="at most 3"):
        medusa(EngineSetup("medusa", 4, tmp_path, target, artefact_dir=art, manifest={}))


def test_a_peagle_head_runs_as_eagle3_with_parallel_drafting_and_its_placeholder(tmp_path):
    from draftsmith.inference.drafters.peagle import PEagleHead

    target = random_model("llama", seed=0, layers=4)
    d2t, t2d = draft_vocab(torch.arange(128).flip(0), 80)
    art = _artefact(tmp_path / "art", PEagleHead.for_target(target, d2t, t2d, None, mask_token_id=5))
    m = eagle(EngineSetup("eagle", 4, tmp_path / "x", target, artefact_dir=art))
    assert m.speculative_config == {"method": "eagle3", "model": str(tmp_path / "x" / "eagle3"),
                                    "num_speculative_tokens": 4, "parallel_drafting": True}
    config = json.loads((tmp_path / "x" / "eagle3" / "config.json").read_text())
    assert config["mask_token_id"] == 5 and "mask_hidden" in load_file(str(tmp_path / "x" / "eagle3" /
                                                                           "model.safetensors"))
    assert m.draftsmith_options == {"tree": "chain", "draft_length": 4}


def test_a_dflash_draft_runs_as_dflash_with_its_block_and_layer_ids(tmp_path):
    from draftsmith.inference.drafters.dflash import DFlashDraft
    from draftsmith.inference.methods.dflash import vllm_engine as dflash

    target = random_model("llama", seed=0, layers=4)
    art = _artefact(tmp_path / "art", DFlashDraft.for_target(target, 2, block_size=6, mask_token_id=5))
    m = dflash(EngineSetup("dflash", None, tmp_path / "x", target, artefact_dir=art))
    assert m.speculative_config == {"method": "dflash", "model": str(tmp_path / "x" / "dflash"),
                                    "num_speculative_tokens": 5}  # the whole block's masks by default
    assert m.draftsmith_options == {"tree": "chain", "draft_length": 5}
    config = json.loads((tmp_path / "x" / "dflash" / "config.json").read_text())
    assert config["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [0, 2]}
    assert dflash(EngineSetup("dflash", 3, tmp_path / "y", target, artefact_dir=art)).draftsmith_options == \
        {"tree": "chain", "draft_length": 3}
    with pytest.raises(ConfigError, match="blocks of 6"):
        dflash(EngineSetup("dflash", 6, tmp_path / "z", target, artefact_dir=art))
