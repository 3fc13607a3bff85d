"""Host synchronisations per decoding step, counted on the CPU (tests/common/host_reads.py): what a GPU would wait
for. With step timing off, plain decoding reads its verdict once and uploads its committed tokens once per step; a
draft model reads its whole chain once; prompt lookup reads nothing of the context (it keeps it on the host)."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.proposers.draft_model import DraftModelProposer
from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

PROMPT = torch.tensor([5, 9, 11, 5, 9, 11, 5, 9, 11, 5, 9, 11, 5, 9])


def counted(proposer, target, *models, steps: int = 20) -> tuple[float, float, int]:
    """``(reads, uploads, steps)`` per step of the second of two identical generations (the first warms up)."""
    config = GenerationConfig(max_new_tokens=steps, timing=False)
    adapter = ModelAdapter(target)
    generate(adapter, PROMPT, config, proposer)
    with HostReads(target, *models) as counter:
        result = generate(adapter, PROMPT, config, proposer)
    n = len(result.accept_lengths)
    return counter.reads / n, counter.uploads / n, n


@pytest.fixture(scope="module")
def pair():
    return random_model("llama", seed=0, layers=2).eval(), random_model("llama", seed=1, layers=1).eval()


def test_plain_decoding_reads_one_verdict_and_uploads_one_token_per_step(pair):
    reads, uploads, steps = counted(None, pair[0], pair[0])
    assert steps == 20 and reads <= 1.0 and uploads <= 1.1


def test_a_draft_model_reads_its_chain_once_per_step(pair):
    target, draft = pair
    proposer = DraftModelProposer(draft, DraftLengthPolicy(length=4), confidence_threshold=0.0)
    reads, uploads, _ = counted(proposer, target, target, draft)
    assert reads <= 2.0 + 0.1 and uploads <= 1.1  # the chain, the verdict (+ the prompt once at reset)


def test_the_confidence_stop_reads_once_per_drafted_token(pair):
    target, draft = pair
    proposer = DraftModelProposer(draft, DraftLengthPolicy(length=4), confidence_threshold=0.01)
    reads, _, _ = counted(proposer, target, target, draft)
    assert reads <= 1 + 4 + 0.1  # the verdict, and each token's probability and id together


def test_prompt_lookup_reads_nothing_of_the_context(pair):
    proposer = PromptLookupProposer(num_draft_tokens=3, adaptive=False)
    reads, uploads, _ = counted(proposer, pair[0], pair[0])
    assert reads <= 1.1 and uploads <= 2.1  # the verdict; the committed tokens and, when it drafts, its draft
