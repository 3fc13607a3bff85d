"""DFlash: the training forward over many blocks is what the proposer's block forward computes, drafting is lossless
(greedy token for token, sampling in distribution), one draft forward per step, and the artefact and vLLM export
round trip."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.drafters.dflash import DFlashDraft, dflash_layers
from draftsmith.inference.evaluation.distribution import check_distribution
from draftsmith.inference.proposers.dflash import DFlashProposer

MASK = 7


def _draft(target, layers=2, block=4, seed=3) -> DFlashDraft:
    draft = DFlashDraft.for_target(target, layers, block_size=block, mask_token_id=MASK)
    torch.manual_seed(seed)
    for name, p in draft.named_parameters():
        if "norm" not in name:
            torch.nn.init.normal_(p, std=0.2)
    return draft.eval()


def _proposer(target, draft, length=None) -> DFlashProposer:
    return DFlashProposer(draft, target.get_input_embeddings(), target.get_output_embeddings(), length=length)


def test_target_layers_follow_the_reference_and_stay_distinct_on_shallow_targets():
    assert dflash_layers(36, 5) == (2, 10, 18, 26, 34)  # the reference's [1, 9, 17, 25, 33] layer outputs, +1
    assert dflash_layers(36, 1) == (19,)
    assert dflash_layers(2, 1) == (1,)  # never the last layer's (final-normed) output
    assert dflash_layers(4, 2) == (1, 3)  # 1 .. L-3 holds one layer: spread over the outputs 0 .. L-2
    assert dflash_layers(30, 3) == (2, 15, 28)
    with pytest.raises(Exception, match="lower draft_layers"):
        dflash_layers(4, 4)


def test_the_training_blocks_are_what_the_proposer_drafts():
    """Block n of the training forward (anchor a: context s < a, bidirectional block) gives the logits the proposer's
    block gives with the first a tokens processed and x_a pending."""
    from draftsmith.trainers.dflash.trainer import DFlashTraining, block_inputs, block_visibility

    target = random_model("llama", seed=0, layers=4)
    draft = _draft(target)
    ids = torch.randint(3, 100, (1, 14), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    anchors, valid = torch.tensor([[2, 5, 9]]), torch.tensor([[True, True, True]])
    block_ids, positions, _ = block_inputs(ids, labels, anchors, valid, draft.block_size, MASK)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.inference_mode():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = {i: out.hidden_states[i] for i in draft.hidden_layers}
        visible = block_visibility(anchors, valid, ids.shape[1], draft.block_size)
        states = DFlashTraining(draft)(feats, embed(block_ids.flatten(1)), positions.flatten(1), visible)
        trained = head(states).view(1, 3, draft.block_size, -1)
        for n, a in enumerate(anchors[0].tolist()):
            proposer = _proposer(target, draft)
            proposer.reset(ids[0, : a + 1])
            proposer.prefill_hidden({i: out.hidden_states[i][0, :a] for i in draft.hidden_layers})
            greedy = proposer.propose(ids[0, : a + 1], 8, SamplingParams())
            assert greedy.tokens.tolist() == trained[0, n, 1:].argmax(-1).tolist()
            block = torch.full((draft.block_size,), MASK)
            block[0] = ids[0, a]
            pos = torch.arange(a, a + draft.block_size)[None]
            vis = torch.ones(draft.block_size, a + draft.block_size, dtype=torch.bool)
            decoded = head(draft(embed(block)[None], pos, proposer._cache, vis))[0]
            assert torch.allclose(decoded, trained[0, n], atol=1e-4), (n, a)


def test_greedy_drafting_is_token_identical_with_one_draft_forward_per_step():
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = _proposer(target, _draft(target))
    for seed in range(2):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        proposer.reset_stats()
        out = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert out.output_ids == ar.output_ids
        assert proposer.stats["draft_forwards"] == out.proposed_by_depth[0]  # one per step that drafted
        assert proposer._cache.get_seq_length(0) == proposer._true  # no block entry stays in the cache


def test_a_draft_that_agrees_with_the_target_is_accepted_whole():
    """A draft whose mask slots read the target's own next tokens would be accepted in full: checked through the
    accounting with a proposer whose drafts are replaced by AR's continuation."""
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    prompt = torch.randint(3, 100, (9,), generator=torch.Generator().manual_seed(4))
    ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=18))
    proposer = _proposer(target, _draft(target))
    answer = torch.tensor(ar.output_ids)

    def oracle(tokens, max_tokens, sampling, generator=None):
        from draftsmith.inference.core.verify import Draft

        done = tokens.numel() - prompt.numel()  # answer tokens committed, the pending one included
        proposer.stats["draft_forwards"] += 1
        return Draft.chain(answer[done: done + min(3, max_tokens)])

    proposer.propose = oracle
    out = generate(adapter, prompt, GenerationConfig(max_new_tokens=18), proposer)
    assert out.output_ids == ar.output_ids
    assert max(out.accept_lengths) == 4  # three drafts and the bonus token


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution():
    """Speculative sampling with the block's independent per-slot proposals keeps the target's distribution (slow:
    400 sampled answers of each kind, about a minute on one core)."""
    target = random_model("llama", seed=0, layers=4, vocab_size=24)
    draft = _draft(target, layers=1, block=4)
    res = check_distribution(target, lambda: _proposer(target, draft), [[1, 5, 7], [2, 9]],
                             SamplingParams(temperature=1.0), num_samples=200, num_positions=3, seed=0)
    assert res.passed, res.summary()


def test_a_length_beyond_the_block_is_refused_in_one_line():
    target = random_model("llama", seed=0, layers=4)
    with pytest.raises(Exception, match="drafts 1 to 3 tokens per step"):
        _proposer(target, _draft(target), length=4)


def test_the_artefact_and_the_vllm_export_round_trip(tmp_path):
    from safetensors.torch import load_file, save_file

    from draftsmith.common.io import atomic_write_json
    from draftsmith.inference.artefacts.dflash import export_dflash, load_dflash_draft, read_dflash_export

    target = random_model("llama", seed=0, layers=6)
    draft = _draft(target, layers=2)
    draft.hidden_layers = (4, 2)  # an order the export sorts: fc's column blocks follow
    save_file({k: v.contiguous() for k, v in draft.state_dict().items()}, str(tmp_path / "heads.safetensors"))
    atomic_write_json(tmp_path / "heads_config.json", draft.artefact_config())
    loaded = load_dflash_draft(tmp_path, target)
    assert loaded.hidden_layers == (4, 2) and loaded.mask_token_id == MASK and loaded.block_size == 4
    out = export_dflash(loaded, target.config, "vllm-dflash", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [1, 3]}  # vLLM's: layer outputs
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4]  # the same layers as hidden-state indices
    assert config["block_size"] == 4 and config["num_hidden_layers"] == 2
    tensors = load_file(str(out / "model.safetensors"))
    h, d = int(target.config.hidden_size), int(config["head_dim"])
    assert tensors["fc.weight"].shape == (h, 2 * h)
    assert tensors["layers.1.self_attn.k_norm.weight"].shape == (d,)  # every tensor shipped, q/k norms included
    assert not any(k.startswith(("embed_tokens", "lm_head", "rotary")) for k in tensors)  # the target's are shared
    back = read_dflash_export(out, target)
    feats = {i: torch.randn(1, 5, h) for i in (2, 4)}
    assert torch.allclose(back.context(feats), loaded.context(feats), atol=1e-6)


def _tree(depth: int, nodes: int = 12):
    from draftsmith.inference.core.trees import default_accuracy, greedy_choices, tree_from_choices

    return tree_from_choices(greedy_choices(default_accuracy(depth), nodes, chain=depth))


def test_a_static_tree_over_the_slots_top_k_is_token_identical():
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = DFlashProposer(_draft(target), target.get_input_embeddings(), target.get_output_embeddings(),
                              tree=_tree(3))
    assert proposer.name == "dflash (static tree)"
    for seed in range(1):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        out = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert out.output_ids == ar.output_ids
    with pytest.raises(Exception, match="the tree is 3 deep but the block drafts 2"):
        DFlashProposer(_draft(target), target.get_input_embeddings(), target.get_output_embeddings(), length=2,
                       tree=_tree(3))


@pytest.mark.slow
def test_sampling_through_a_static_tree_keeps_the_target_distribution():
    target = random_model("llama", seed=0, layers=4, vocab_size=24)
    draft = _draft(target, layers=1, block=4)
    res = check_distribution(target, lambda: DFlashProposer(draft, target.get_input_embeddings(),
                                                            target.get_output_embeddings(), tree=_tree(3, 8)),
                             [[1, 5, 7], [2, 9]], SamplingParams(temperature=1.0), num_samples=200, num_positions=3,
                             seed=0)
    assert res.passed, res.summary()
