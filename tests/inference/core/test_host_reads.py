"""Host synchronisations per decoding step, counted on the CPU (tests/common/host_reads.py): what a GPU would wait
for. With step timing off, every proposer but EAGLE-2's dynamic tree (and a draft model's confidence stop, which
reads each drafted token) reads one tensor per step, the verdict (the accepted path, the token after it and the
draft's tokens in one transfer); the committed tokens, the accepted rows and the KV cache's kept entries are
indexed on the device from the verdict's own tensors, so nothing is uploaded but a draft made on the host (prompt
lookup's) and a dynamic tree's structure. The dynamic tree reads each level's expanded nodes (the first level's
excepted) and its kept nodes once."""

from __future__ import annotations

import pytest
import torch
from host_reads import HostReads

from draftsmith.data.tiny_models import random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.trees import chain_choices, tree_from_choices
from draftsmith.inference.core.verify import Draft
from draftsmith.inference.drafters.eagle import Eagle3Head, EagleHead, draft_vocab
from draftsmith.inference.drafters.medusa import MedusaHeads
from draftsmith.inference.proposers.draft_model import DraftModelProposer
from draftsmith.inference.proposers.eagle import EagleProposer
from draftsmith.inference.proposers.jacobi import JacobiProposer
from draftsmith.inference.proposers.medusa import MedusaProposer
from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer

PROMPT = torch.tensor([5, 9, 11, 5, 9, 11, 5, 9, 11, 5, 9, 11, 5, 9])


def counted(proposer, target, *models, steps: int = 20) -> tuple[float, float, int, HostReads]:
    """``(reads, uploads, steps, counter)`` per step of the second of two identical generations (the first warms
    up, under the same counter: what it leaves on the device, such as a static tree's structure, is known there)."""
    config = GenerationConfig(max_new_tokens=steps, timing=False)
    adapter = ModelAdapter(target)
    with HostReads(target, *models) as counter:
        generate(adapter, PROMPT, config, proposer)
        counter.reset()
        result = generate(adapter, PROMPT, config, proposer)
    n = len(result.accept_lengths)
    return counter.reads / n, counter.uploads / n, n, counter


@pytest.fixture(scope="module")
def pair():
    return random_model("llama", seed=0, layers=2).eval(), random_model("llama", seed=1, layers=1).eval()


def _eagle_head(target):
    head = EagleHead.for_target(target)
    torch.manual_seed(1)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head


def _medusa(target, choices):
    torch.manual_seed(0)
    heads = MedusaHeads(hidden=32, vocab=128, heads=3)
    for block in heads.blocks:
        torch.nn.init.normal_(block[0].linear.weight, std=0.5)
    return MedusaProposer(heads, target.get_output_embeddings(), tree_from_choices(choices)), heads


def test_plain_decoding_reads_one_verdict_and_uploads_nothing(pair):
    reads, uploads, steps, _ = counted(None, pair[0], pair[0])
    assert steps == 20 and reads <= 1.0 and uploads <= 0.05  # the prompt, once


def test_a_draft_model_reads_its_chain_with_the_verdict(pair):
    target, draft = pair
    proposer = DraftModelProposer(draft, DraftLengthPolicy(length=4), confidence_threshold=0.0)
    reads, uploads, _, _ = counted(proposer, target, target, draft)
    assert reads <= 1.05 and uploads <= 0.05  # the verdict (+ the prompt once at reset)


def test_the_confidence_stop_reads_once_per_drafted_token(pair):
    target, draft = pair
    proposer = DraftModelProposer(draft, DraftLengthPolicy(length=4), confidence_threshold=0.01)
    reads, _, _, _ = counted(proposer, target, target, draft)
    assert reads <= 1 + 4 + 0.1  # the verdict, and each token's probability and id together


def test_prompt_lookup_reads_nothing_of_the_context(pair):
    proposer = PromptLookupProposer(num_draft_tokens=3, adaptive=False)
    reads, uploads, steps, counter = counted(proposer, pair[0], pair[0])
    drafting = sum(n for site, n in counter.sites.items() if "prompt_lookup.py" in site and site.startswith("upload"))
    assert reads <= 1.1 and uploads * steps <= 1 + drafting  # the verdict; the prompt once, and each draft it makes


@pytest.mark.parametrize("variant", ["eagle1", "eagle3"])
def test_an_eagle_chain_reads_only_the_verdict(pair, variant):
    target = pair[0] if variant == "eagle1" else random_model("llama", seed=0, layers=4).eval()
    if variant == "eagle1":
        head = _eagle_head(target)
    else:
        head = Eagle3Head.for_target(target, *draft_vocab(torch.arange(128).flip(0), 96))
    proposer = EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), length=4)
    reads, uploads, _, _ = counted(proposer, target, target, head)
    assert reads <= 1.0 and uploads <= 0.1  # the drafted tokens and the committed ones stay on the device


def test_the_eagle2_tree_reads_once_per_level_and_its_kept_nodes_once(pair):
    target = pair[0]
    head = _eagle_head(target)
    depth = 4
    proposer = EagleProposer(head, target.get_input_embeddings(), target.get_output_embeddings(), tree="dynamic",
                             depth=depth, top_k=3, total_tokens=10)
    reads, uploads, _, counter = counted(proposer, target, target, head)
    levels = sum(n for site, n in counter.sites.items() if site.startswith("read") and "eagle.py" in site)
    assert reads <= (depth - 2) + 1 + 1 and reads <= 3.8  # levels 2 .. depth-1, the kept nodes, the verdict
    assert uploads <= 1.1 and levels > 0  # the tree's structure, once per step


@pytest.mark.parametrize("choices", [chain_choices(3), [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]],
                         ids=["chain", "tree"])
def test_medusa_reads_only_the_verdict_and_its_static_tree_reaches_the_device_once(pair, choices):
    target = pair[0]
    proposer, heads = _medusa(target, choices)
    reads, uploads, _, _ = counted(proposer, target, target, heads)
    assert reads <= 1.0 and uploads <= 0.05


def test_jacobi_keeps_its_guess_on_the_device_and_its_context_on_the_host(pair):
    reads, uploads, _, _ = counted(JacobiProposer(block=4), pair[0], pair[0])
    assert reads <= 1.05 and uploads <= 0.15  # the verdict; the prompt, and the guess's top-ups from the context


class SecondBranch:
    """A tree whose true continuation is on its second branch, two deep: the accepted path is nodes 1 and 3, so the
    verification keeps entries out of order in the target's KV cache."""

    name, lossless, hidden_layers = "second branch", True, ()

    def __init__(self, answer: list[int]) -> None:
        self.answer = answer
        self.paths: list[list[int]] = []

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self.start = prompt_ids.numel()

    def observe(self, feedback) -> None:
        self.paths.append(feedback.accepted)

    def propose(self, tokens, max_tokens, sampling, generator=None) -> Draft:
        i = tokens.numel() - self.start
        if max_tokens < 2 or i + 2 > len(self.answer):
            return Draft.empty()
        first, second = self.answer[i], self.answer[i + 1]
        wrong = [(first + 1) % 128, (second + 1) % 128]
        return Draft(tokens=torch.tensor([wrong[0], first, wrong[1], second]), parents=torch.tensor([-1, -1, 1, 1]))


def test_an_out_of_order_branch_is_kept_in_the_cache_without_an_upload(pair):
    target = pair[0]
    adapter = ModelAdapter(target)
    answer = generate(adapter, PROMPT, GenerationConfig(max_new_tokens=24)).output_ids
    proposer = SecondBranch(answer)
    reads, _, steps, counter = counted(proposer, target, target)
    assert proposer.paths.count([1, 3]) >= steps - 2  # every full step but near the end
    uploads = [site for site in counter.sites if site.startswith("upload")]
    assert not any("kv_cache.py" in site for site in counter.sites)  # the kept rows are indexed on the device
    assert reads <= 1.0 and all(any(f in site for f in ("verify.py", "tree_shape.py", "generate.py")) for site in uploads)
    # per drafting step: the draft's tokens and its structure; once: the prompt
    assert sum(counter.sites[site] for site in uploads) <= 2 * steps + 1
    assert generate(adapter, PROMPT, GenerationConfig(max_new_tokens=20), proposer).output_ids == answer[:20]
