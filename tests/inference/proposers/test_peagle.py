"""P-EAGLE: the training-time test with placeholders is what parallel drafting computes, drafting is lossless (greedy
token for token, sampling in distribution), one head forward per step, and the artefact and vLLM export round trip."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.drafters.eagle import draft_vocab
from draftsmith.inference.drafters.peagle import PEagleHead, mask_token
from draftsmith.inference.evaluation.distribution import check_distribution
from draftsmith.inference.proposers.peagle import PEagleProposer

MASK = 7


def _head(target, vd=96, seed=3, vocab=128) -> PEagleHead:
    d2t, t2d = draft_vocab(torch.arange(vocab).flip(0), vd)
    head = PEagleHead.for_target(target, d2t, t2d, mask_token_id=MASK)
    torch.manual_seed(seed)
    for p in head.midlayer.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head.eval()


def _proposer(target, head, length=4) -> PEagleProposer:
    return PEagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), length=length)


def test_the_unrolled_placeholder_steps_are_what_the_block_drafts():
    """Step j's logits at anchor t (training) equal the block's slot j after the true inputs 0..t (decoding): mask
    embeddings and fc(mask_hidden) at positions t+1 .. t+j, causal."""
    from draftsmith.trainers.eagle.ttt import Eagle3TTT, shifted

    target = random_model("llama", seed=0, layers=4)
    unrolled = Eagle3TTT(_head(target)).eval()
    head = unrolled.head
    ids = torch.randint(3, 100, (1, 10), generator=torch.Generator().manual_seed(0))
    embed = target.get_input_embeddings()
    steps = 3
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = torch.cat([out.hidden_states[i][:, :-1] for i in head.hidden_layers], -1)  # [1, A, 96]
        step_embeds = torch.stack([embed(shifted(ids[:, 1:], j)) for j in range(steps)])  # [K, 1, A, H]
        step_embeds[1:] = embed(torch.tensor([[MASK]]))
        logits = unrolled(feats, step_embeds)  # [K, 1, A, Vd]
        for t in range(ids.shape[1] - 1 - steps):
            proposer = _proposer(target, head, length=steps)
            proposer.reset(ids[0, : t + 2])
            proposer.prefill_hidden({i: out.hidden_states[i][0, : t + 1] for i in head.hidden_layers})
            block = head.draft_logits(torch.cat([proposer._feature[None], proposer._block]))  # [K, Vd]
            for j in range(steps):
                assert torch.allclose(block[j], logits[j, 0, t], atol=1e-4), (t, j)


def test_greedy_drafting_is_token_identical_with_one_head_forward_per_step():
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = _proposer(target, _head(target))
    for seed in range(2):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        proposer.forwards = 0
        out = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert out.output_ids == ar.output_ids
        assert proposer.forwards == len(out.accept_lengths) + 1  # the prefill and one feed per verification
        assert proposer._cache.get_seq_length(0) == proposer._true  # no placeholder entry stays in the cache


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution():
    """Speculative sampling with the block's independent per-position proposals keeps the target's distribution
    (slow: 400 sampled answers of each kind, about a minute on one core)."""
    target = random_model("llama", seed=0, layers=4, vocab_size=24)
    head = _head(target, vd=16, vocab=24)
    res = check_distribution(target, lambda: _proposer(target, head, length=3), [[1, 5, 7], [2, 9]],
                             SamplingParams(temperature=1.0), num_samples=200, num_positions=3, seed=0)
    assert res.passed, res.summary()


def test_a_tree_is_refused_in_one_line():
    target = random_model("llama", seed=0, layers=4)
    with pytest.raises(Exception, match="P-EAGLE drafts its block as a chain or a static tree"):
        PEagleProposer(_head(target), target.get_input_embeddings(), target.get_output_embeddings(), tree="dynamic")


def test_the_mask_token_follows_the_references_order():
    class Tok:
        mask_token_id, pad_token_id, unk_token_id, eos_token_id = None, 4, 3, 2

    assert mask_token(Tok(), None) == 4
    Tok.mask_token_id = 9
    assert mask_token(Tok(), None) == 9


def test_the_artefact_and_the_vllm_export_round_trip(tmp_path):
    from safetensors.torch import save_file

    from draftsmith.common.io import atomic_write_json
    from draftsmith.inference.artefacts.eagle import export_eagle, load_eagle_head, read_eagle_export

    target = random_model("llama", seed=0, layers=4)
    head = _head(target)
    head.hidden_layers = (3, 1, 2)  # a layer order the engines reorder: the placeholder's blocks follow fc's
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(tmp_path / "heads.safetensors"))
    atomic_write_json(tmp_path / "heads_config.json", head.artefact_config())
    loaded = load_eagle_head(tmp_path, target)
    assert isinstance(loaded, PEagleHead) and loaded.mask_token_id == MASK
    assert torch.equal(loaded.mask_hidden, head.mask_hidden)
    out = export_eagle(loaded, target.config, "eagle3", tmp_path / "export")
    config = json.loads((out / "config.json").read_text())
    assert config["mask_token_id"] == config["pard_token"] == MASK
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    back = read_eagle_export(out, target)
    feats = {i: torch.randn(2, 32) for i in (1, 2, 3)}
    assert isinstance(back, PEagleHead)
    assert torch.allclose(back.mask_state(), loaded.mask_state(), atol=1e-6)  # fc and its input reordered alike
    assert torch.allclose(back.fuse(feats), loaded.fuse(feats), atol=1e-6)
    with pytest.raises(Exception, match="P-EAGLE head exports as --format eagle3"):
        export_eagle(loaded, target.config, "speculators", tmp_path / "spec")


def test_a_static_tree_over_the_blocks_top_k_is_token_identical():
    from draftsmith.inference.core.trees import default_accuracy, greedy_choices, tree_from_choices

    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    tree = tree_from_choices(greedy_choices(default_accuracy(4), 12, chain=4))
    proposer = PEagleProposer(_head(target), target.get_input_embeddings(), target.get_output_embeddings(), length=4,
                              tree=tree)
    assert proposer.name == "p-eagle (static tree)"
    assert proposer.report_section()[1]["nodes"] == 12
    for seed in range(2):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        out = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert out.output_ids == ar.output_ids


def test_a_mask_token_outside_the_vocabulary_is_one_line():
    from draftsmith.common.errors import ConfigError

    target = random_model("llama", seed=0, vocab_size=128)
    d2t, t2d = draft_vocab(torch.arange(128), 96)
    with pytest.raises(ConfigError, match=r"mask_token_id=999999 is not a token of the target's vocabulary \(0..127\)"):
        PEagleHead.for_target(target, d2t, t2d, mask_token_id=999999)
