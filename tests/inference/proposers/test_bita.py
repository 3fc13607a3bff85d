"""BiTA decoding: the mask-token layouts against hand-built ones, the prompt prefix against a plain forward, greedy
identity, the cache after a partial accept, and the distribution check."""

import pytest
import torch

from draftsmith.data.tiny_models import (
    LAYOUT_FAMILIES,
    random_model,
)
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.kv_cache import KVPrefix
from draftsmith.inference.core.masks import additive_mask
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.drafters.bita import BitaEmbeddings, decode_extras_layout, group_visibility, training_layout
from draftsmith.inference.evaluation.distribution import check_distribution
from draftsmith.inference.proposers.bita import BitaProposer, triangle_tree


@pytest.fixture(params=LAYOUT_FAMILIES)
def family(request):  # the proposers' logic on one family of each layout
    return request.param

T, F = True, False


def _prompt(seed, n=10):
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


def _embeddings(model, mode="deep", attention="bidirectional", seed=0, masks=3):
    emb = BitaEmbeddings.for_target(model, prompt_tokens=4, mask_tokens=masks, prompt_mode=mode, mask_attention=attention)
    emb.init_from_target(ModelAdapter(model), seed=seed)
    return emb


def test_group_visibility_is_block_diagonal():
    assert group_visibility(2, 2).tolist() == [[T, T, F, F], [T, T, F, F], [F, F, T, T], [F, F, T, T]]
    assert group_visibility(2, 2, "causal").tolist() == [[T, F, F, F], [T, T, F, F], [F, F, T, F], [F, F, T, T]]


def test_decode_layout_against_a_hand_built_one():
    """Tree: node 0 (depth 1), node 1 child of node 0 (depth 2), node 2 child of the root (depth 1); M = 2 masks."""
    visible, depths = decode_extras_layout([-1, 0, -1], masks=2, mask_attention="causal")
    # columns: pending, n0, n1, n2, then groups g0 (root), g1 (n0), g2 (n1), g3 (n2), two masks each
    want = [
        [T, F, F, F, T, F, F, F, F, F, F, F],
        [T, F, F, F, T, T, F, F, F, F, F, F],
        [T, T, F, F, F, F, T, F, F, F, F, F],
        [T, T, F, F, F, F, T, T, F, F, F, F],
        [T, T, T, F, F, F, F, F, T, F, F, F],
        [T, T, T, F, F, F, F, F, T, T, F, F],
        [T, F, F, T, F, F, F, F, F, F, T, F],
        [T, F, F, T, F, F, F, F, F, F, T, T],
    ]
    assert visible.tolist() == want
    assert depths.tolist() == [1, 2, 2, 3, 3, 4, 2, 3]


def test_training_layout_against_a_hand_built_one():
    labels = torch.tensor([[-100, -100, 10, 11, 12, 13], [-100, 20, 21, 22, -100, -100]])
    points = torch.tensor([[1, 3], [0, -1]])  # example 1 has one group only
    seen, positions, targets = training_layout(points, labels, masks=2)
    assert positions.tolist() == [[2, 3, 4, 5], [1, 2, 0, 0]]
    # mask k after token t predicts x_{t+k+1}
    assert targets.tolist() == [[11, 12, 13, -100], [21, 22, -100, -100]]
    assert seen.tolist() == [
        [[T, T, F, F, F, F]] * 2 + [[T, T, T, T, F, F]] * 2,
        [[T, F, F, F, F, F]] * 2 + [[F, F, F, F, F, F]] * 2,
    ]


def test_triangle_tree_shape():
    cand = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    tokens, parents = triangle_tree(cand, top_k=3)
    assert tokens == [1, 2, 3, 4, 5, 7]
    assert parents == [-1, -1, -1, 0, 0, 3]


def test_prompt_prefix_matches_a_plain_forward_and_the_sequence_never_sees_it(family):
    """A plain prompt (embeddings mode) as a prefix equals running [prompt, sequence, masks] through the model with
    the same 4-D mask and positions; rows that do not see the prefix get the model's own logits."""
    model = random_model(family, seed=0, layers=2, hidden=32)
    adapter = ModelAdapter(model)
    emb = _embeddings(model, mode="embeddings", masks=2)
    seq = _prompt(1, n=6)
    with torch.no_grad():
        keys, values = emb.prefix_kv(adapter)
        p = emb.prompt_tokens
        inputs = torch.cat([adapter.embed_tokens(seq), emb.mask_inputs(1)])[None]  # [1, 6 + 2, H]
        n = 8
        tree = torch.ones(n, n, dtype=torch.bool).tril()
        tree[6:, 6:] = True  # the masks see each other
        rows = torch.zeros(1, n, p, dtype=torch.bool)
        rows[:, 6:] = True
        pos = torch.cat([torch.arange(6), torch.tensor([6, 7])])[None]
        out = adapter.forward(inputs_embeds=inputs, position_ids=pos, tree=tree, kv_prefix=KVPrefix(keys, values, rows))
        plain = model(seq[None]).logits[0]
        assert (out.logits[0, :6] - plain).abs().max() <= 1e-4
        # reference: the prompt embeddings first (positions 0..P-1), then the same thing
        full = torch.cat([emb.prompt(torch.arange(p)[None]), inputs], dim=1)  # [1, P + 8, H]
        vis = torch.zeros(p + n, p + n, dtype=torch.bool)
        vis[:p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
        vis[p:, p:] = tree
        vis[p + 6:, :p] = True
        ref_pos = torch.cat([torch.arange(p)[None], pos], dim=1)
        ref = model(inputs_embeds=full, attention_mask=additive_mask(vis, torch.float32), position_ids=ref_pos).logits
        assert (out.logits[0, 6:] - ref[0, p + 6:]).abs().max() <= 1e-4


@pytest.mark.parametrize("tree", ["chain", "triangle"])
@pytest.mark.parametrize("mode", ["deep", "embeddings"])
def test_greedy_is_token_identical(family, tree, mode):
    model = random_model(family, seed=0, layers=3, hidden=64)
    adapter = ModelAdapter(model)
    proposer = BitaProposer(_embeddings(model, mode=mode), tree=tree, top_k=3)
    for seed in range(3):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=20))
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=20), proposer)
        assert sp.output_ids == ar.output_ids
        assert sp.num_proposed > 0


def test_a_draft_that_repeats_the_answer_is_accepted_and_the_cache_holds_only_committed_tokens():
    """Masks trained to nothing still draft; here the candidates are forced to the true continuation so that steps
    accept partially, and after every step the cache equals a plain prefill of the committed tokens."""
    model = random_model("llama", seed=0, layers=2, hidden=48)
    adapter = ModelAdapter(model)
    p = _prompt(4)
    ar = generate(adapter, p, GenerationConfig(max_new_tokens=16)).output_ids
    checks = []

    class Oracle(BitaProposer):
        """Drafts the true next 2 tokens and a wrong third, so every full step accepts 2 of 3."""

        def propose(self, tokens, max_tokens, sampling, generator=None):
            done = tokens.numel() - p.numel()  # answer tokens committed; the pending one is ar[done - 1]
            self._candidates = None if done == 0 else torch.tensor(
                [[ar[done]] if done < len(ar) else [0], [ar[done + 1]] if done + 1 < len(ar) else [0], [1]])
            return super().propose(tokens, max_tokens, sampling, generator)

        def observe(self, feedback):
            checks.append((feedback.num_proposed, feedback.num_accepted))
            super().observe(feedback)

    prop = Oracle(_embeddings(model), tree="chain")
    cache_states = []
    original_propose = prop.propose

    def spy(tokens, max_tokens, sampling, generator=None):
        cache = prop_view["cache"]
        assert cache.lengths() == [tokens.numel() - 1] * adapter.num_layers
        ref = adapter.new_cache(tokens.numel())
        adapter.forward(tokens[None, :-1], ref, compute_logits=False)
        for i in range(adapter.num_layers):
            k, v = cache.layer(i)
            rk, rv = ref.layer(i)
            assert (k - rk).abs().max() <= 1e-4 and (v - rv).abs().max() <= 1e-4
        cache_states.append(tokens.numel())
        return original_propose(tokens, max_tokens, sampling, generator)

    prop_view = {}
    original_bind = prop.bind

    def bind(view):
        prop_view["cache"] = view.cache
        original_bind(view)

    prop.bind, prop.propose = bind, spy
    out = generate(adapter, p, GenerationConfig(max_new_tokens=16), prop)
    assert out.output_ids == ar
    assert (3, 2) in checks  # partial accepts happened
    assert len(cache_states) == out.steps


def test_sampling_keeps_the_target_distribution():
    model = random_model("llama", seed=0, layers=2, hidden=32, vocab_size=24)
    emb = _embeddings(model)
    res = check_distribution(model, lambda: BitaProposer(emb, tree="triangle", top_k=3), [[1, 5, 7], [2, 9]],
                             SamplingParams(temperature=1.0), num_samples=400, num_positions=3, seed=0)
    assert res.passed, res.summary()


def test_embeddings_refuse_another_target():
    small = random_model("llama", seed=0, layers=2, hidden=32)
    other = random_model("llama", seed=0, layers=3, hidden=32)
    emb = BitaEmbeddings.for_target(small, prompt_tokens=2, mask_tokens=2)
    emb.check_target(small)
    with pytest.raises(Exception, match="trained for"):
        emb.check_target(other)


def test_the_evaluator_counts_the_mask_rows_of_every_step():
    from draftsmith.inference.evaluation.runs import StepRecorder

    model = random_model("llama", seed=0, layers=2, hidden=32)
    recorder = StepRecorder(BitaProposer(_embeddings(model), tree="chain"))
    res = generate(ModelAdapter(model), _prompt(0), GenerationConfig(max_new_tokens=12), recorder)
    assert len(recorder.extra_rows) == res.steps
    assert recorder.extra_rows[0] == 3  # the first step: one group after the pending token
    assert all(m == 3 * (p + 1) for (p, _), m in zip(recorder.steps, recorder.extra_rows[1:]))
