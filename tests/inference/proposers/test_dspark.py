"""DSpark: the training blocks are what the proposer drafts (the Markov chain over its own drafts), drafting is
lossless (greedy token for token, with the confidence stop too; sampling in distribution), and a length beyond the
block is refused."""

from __future__ import annotations

import pytest
import torch

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.drafters.dspark import DSparkDraft
from draftsmith.inference.evaluation.distribution import check_distribution
from draftsmith.inference.proposers.dspark import DSparkProposer

MASK = 7


def _draft(target, layers=2, block=4, seed=3, rank=8) -> DSparkDraft:
    draft = DSparkDraft.for_target(target, layers, block_size=block, mask_token_id=MASK, markov_rank=rank)
    torch.manual_seed(seed)
    for name, p in draft.named_parameters():
        if "norm" not in name:
            torch.nn.init.normal_(p, std=0.2)
    return draft.eval()


def _proposer(target, draft, length=None, threshold=0.0) -> DSparkProposer:
    return DSparkProposer(draft, target.get_input_embeddings(), target.get_output_embeddings(), length=length,
                          confidence_threshold=threshold)


def test_the_proposer_drafts_the_training_blocks_markov_chain_over_its_own_drafts():
    """Block n of the training forward (anchor a) gives the proposer's slot states with x_a pending; the proposer's
    greedy chain is the argmax of LMHead(h_k) + W2 W1[d_{k-1}] (d_{-1} = x_a), and its confidences those of the
    trained head on the same inputs."""
    from draftsmith.trainers.dflash.trainer import DFlashTraining, block_visibility
    from draftsmith.trainers.dspark.trainer import dspark_block_inputs

    target = random_model("llama", seed=0, layers=4)
    draft = _draft(target)
    ids = torch.randint(3, 100, (1, 14), generator=torch.Generator().manual_seed(0))
    anchors, valid = torch.tensor([[2, 5, 9]]), torch.tensor([[True, True, True]])
    block_ids, positions, _, _ = dspark_block_inputs(ids, ids.clone(), anchors, valid, draft.block_size, MASK)
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    with torch.inference_mode():
        out = target(input_ids=ids, output_hidden_states=True)
        feats = {i: out.hidden_states[i] for i in draft.hidden_layers}
        visible = block_visibility(anchors, valid, ids.shape[1], draft.block_size)
        states = DFlashTraining(draft)(feats, embed(block_ids.flatten(1)), positions.flatten(1), visible)
        states = states.view(1, 3, draft.block_size, -1)
        for n, a in enumerate(anchors[0].tolist()):
            proposer = _proposer(target, draft)
            proposer.reset(ids[0, : a + 1])
            proposer.prefill_hidden({i: out.hidden_states[i][0, :a] for i in draft.hidden_layers})
            greedy = proposer.propose(ids[0, : a + 1], 8, SamplingParams())
            prev, want = ids[0, a], []
            for k in range(draft.block_size):
                prev = (head(states[0, n, k]) + draft.markov_head(draft.markov_embed(prev))).argmax(-1)
                want.append(int(prev))
            assert greedy.tokens.tolist() == want, (n, a)


@pytest.mark.parametrize("length, threshold", [(None, 0.0), (2, 0.0), (None, 0.6)])
def test_greedy_drafting_is_token_identical_with_one_draft_forward_per_step(length, threshold):
    target = random_model("llama", seed=0, layers=4)
    adapter = ModelAdapter(target)
    proposer = _proposer(target, _draft(target), length, threshold)
    for seed in range(2):
        prompt = torch.randint(3, 100, (11,), generator=torch.Generator().manual_seed(seed))
        ar = generate(adapter, prompt, GenerationConfig(max_new_tokens=24))
        proposer.reset_stats()
        out = generate(adapter, prompt, GenerationConfig(max_new_tokens=24), proposer)
        assert out.output_ids == ar.output_ids
        assert proposer.stats["draft_forwards"] == out.proposed_by_depth[0]
        assert proposer._cache.get_seq_length(0) == proposer._true
    if threshold:
        assert proposer.stats["stopped_by_confidence"] > 0  # the stop took effect on this random draft


def test_a_length_beyond_the_block_or_a_stop_without_the_head_is_refused_in_one_line():
    target = random_model("llama", seed=0, layers=4)
    with pytest.raises(Exception, match="drafts 1 to 4 tokens per step"):
        _proposer(target, _draft(target), length=5)
    headless = DSparkDraft.for_target(target, 1, block_size=4, mask_token_id=MASK, markov_rank=4, confidence=False)
    with pytest.raises(Exception, match="confidence head"):
        _proposer(target, headless, threshold=0.5)


@pytest.mark.slow
def test_sampling_keeps_the_target_distribution():
    """Speculative sampling with the Markov chain's conditionals as q keeps the target's distribution (slow: 400
    sampled answers of each kind)."""
    target = random_model("llama", seed=0, layers=4, vocab_size=24)
    draft = _draft(target, layers=1, block=4)
    res = check_distribution(target, lambda: _proposer(target, draft), [[1, 5, 7], [2, 9]],
                             SamplingParams(temperature=1.0), num_samples=200, num_positions=3, seed=0)
    assert res.passed, res.summary()
