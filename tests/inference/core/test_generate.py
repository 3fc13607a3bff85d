import pytest
import torch

from draftsmith.data.tiny_models import LAYOUT_FAMILIES, random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig, generate
from draftsmith.inference.core.masks import additive_mask
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.stops import find_stop, stop_lookback, truncate
from draftsmith.inference.core.verify import Draft, ExtraInputs
from draftsmith.inference.proposers.draft_model import DraftModelProposer
from draftsmith.inference.proposers.prompt_lookup import PromptLookupProposer


@pytest.fixture(params=LAYOUT_FAMILIES)
def family(request):  # the loop's logic on one family of each layout; the adapter's tests cover every family
    return request.param


@pytest.fixture(scope="module")
def pair():
    target = random_model("llama", seed=0, layers=3, hidden=64)
    weak_draft = random_model("llama", seed=1, layers=1, hidden=32)
    return target, weak_draft


def _prompt(seed, n=12):
    return torch.randint(3, 128, (n,), generator=torch.Generator().manual_seed(seed))


def _hf_greedy(model, prompt, n):
    out = model.generate(prompt[None], max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, prompt.numel() :].tolist()


def test_ar_matches_transformers_generate(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    for seed in range(3):
        p = _prompt(seed)
        res = generate(adapter, p, GenerationConfig(max_new_tokens=30))
        assert res.output_ids == _hf_greedy(target, p, 30)
        assert res.accept_lengths == [1] * 30 and res.tau == 1.0


@pytest.mark.parametrize("mode", ["fixed", "heuristic", "leviathan"])
def test_draft_model_greedy_is_token_identical(pair, mode):
    target, weak = pair
    adapter = ModelAdapter(target)
    for draft_model in (weak, target):  # a poor draft (many rejections) and a perfect one
        for seed in range(3):
            p = _prompt(seed)
            ar = generate(adapter, p, GenerationConfig(max_new_tokens=33))
            prop = DraftModelProposer(draft_model, DraftLengthPolicy(length=4, mode=mode))
            sp = generate(adapter, p, GenerationConfig(max_new_tokens=33), prop)
            assert sp.output_ids == ar.output_ids
            assert sum(sp.accept_lengths) == 33
            assert all(1 <= a <= 17 for a in sp.accept_lengths)
    # the perfect draft accepts everything (leviathan's length depends on measured timings)
    assert sp.acceptance_rate == 1.0 and sp.tau >= (2 if mode == "leviathan" else 3)


@pytest.mark.parametrize("threshold", [0.05, 0.5, 0.99])
def test_confidence_threshold_stops_drafts_early_and_stays_identical(pair, threshold):
    target, weak = pair
    adapter = ModelAdapter(target)
    for seed in range(3):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=30))
        full = generate(adapter, p, GenerationConfig(max_new_tokens=30), DraftModelProposer(weak, DraftLengthPolicy(6)))
        prop = DraftModelProposer(weak, DraftLengthPolicy(6), confidence_threshold=threshold)
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=30), prop)
        assert sp.output_ids == ar.output_ids
        # fewer nodes per step than the fixed length: the random draft is rarely sure of anything
        assert sp.num_proposed / sp.steps < full.num_proposed / full.steps
        if threshold == 0.99:  # never that sure: one node per step
            assert sp.num_proposed <= sp.steps


class _RecordingDraft(DraftModelProposer):
    """Keeps every proposed token."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def propose(self, *args, **kwargs):
        draft = super().propose(*args, **kwargs)
        self.seen.extend(draft.tokens.tolist())
        return draft


def test_draft_vocab_subset_is_token_identical_and_proposes_only_its_tokens(pair):
    target, weak = pair
    adapter = ModelAdapter(target)
    for draft_model in (weak, target):
        for seed in range(3):
            p = _prompt(seed)
            ar = generate(adapter, p, GenerationConfig(max_new_tokens=30))
            vocab = torch.tensor(sorted(set(range(0, 128, 2)) | set(ar.output_ids[:20])))  # [K]
            prop = _RecordingDraft(draft_model, DraftLengthPolicy(4), vocab=vocab)
            sp = generate(adapter, p, GenerationConfig(max_new_tokens=30), prop)
            assert sp.output_ids == ar.output_ids
            assert prop.seen and set(prop.seen) <= set(vocab.tolist())
            key, section = prop.report_section()  # committed tokens the vocabulary could not have drafted
            outside = [t for t in sp.output_ids if t not in set(vocab.tolist())]
            assert key == "draft_vocab" and section["size"] == vocab.numel()
            assert section["committed_tokens"] == len(sp.output_ids)
            assert section["outside_fraction"] == pytest.approx(len(outside) / len(sp.output_ids))
        if draft_model is target:  # the target's own head over a subset holding its answers: all accepted
            assert sp.acceptance_rate == 1.0


def test_the_report_counts_committed_tokens_outside_the_draft_vocabulary(pair):
    target, weak = pair
    evens = torch.arange(0, 128, 2)  # [64] a vocabulary without the odd tokens
    for seed in range(2):
        prop = DraftModelProposer(weak, DraftLengthPolicy(3), vocab=evens)
        out = generate(ModelAdapter(target), _prompt(seed), GenerationConfig(max_new_tokens=30), prop).output_ids
        odd = sum(t % 2 for t in out)
        assert prop.report_section() == ("draft_vocab", {"size": 64, "committed_tokens": len(out),
                                                         "outside_fraction": pytest.approx(odd / len(out))})
        assert 0 < odd < len(out)
    assert DraftModelProposer(weak).report_section()[1]["size"] == "all"


def test_draft_vocab_subset_sampling_distribution_lives_on_the_subset(pair):
    from draftsmith.inference.proposers.draft_model import scatter_rows

    target, weak = pair
    vocab = torch.tensor([3, 5, 7, 11, 13])
    prop = DraftModelProposer(weak, DraftLengthPolicy(3), vocab=vocab)
    prop.reset(_prompt(0))
    draft = prop.propose(_prompt(0), 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert draft.q.shape[-1] == ModelAdapter(weak).vocab_size
    assert torch.allclose(draft.q.sum(-1), torch.ones(draft.q.shape[0]))
    outside = torch.ones(draft.q.shape[-1], dtype=torch.bool)
    outside[vocab] = False
    assert float(draft.q[:, outside].abs().sum()) == 0.0
    assert set(draft.tokens.tolist()) <= set(vocab.tolist())
    assert torch.equal(scatter_rows(torch.tensor([0.25, 0.75]), torch.tensor([1, 3]), 5),
                       torch.tensor([0.0, 0.25, 0.0, 0.75, 0.0]))


def test_draft_vocab_of_reads_the_config(pair):
    from draftsmith.inference.proposers.draft_model import draft_vocab_of

    _, weak = pair
    assert draft_vocab_of(weak) is None
    weak.config.draft_vocab = [9, 2, 4]
    try:
        assert draft_vocab_of(weak).tolist() == [2, 4, 9]
    finally:
        del weak.config.draft_vocab


def test_confidence_threshold_is_validated(pair):
    with pytest.raises(ValueError, match="confidence_threshold"):
        DraftModelProposer(pair[1], confidence_threshold=1.0)


def test_prompt_lookup_greedy_is_token_identical(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    for seed in range(4):
        p = torch.cat([_prompt(seed, 6)] * 3)  # repetitive prompt so lookups hit
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=25))
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=25), PromptLookupProposer(num_draft_tokens=5))
        assert sp.output_ids == ar.output_ids
        assert sp.num_proposed > 0


def test_eos_inside_a_draft_block_stops_exactly(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(7)
    ar_free = generate(adapter, p, GenerationConfig(max_new_tokens=30)).output_ids
    # pick as EOS a token that first appears in the middle of the answer
    pos = next(i for i in range(5, 30) if ar_free[i] not in ar_free[:i])
    eos = ar_free[pos]
    cfg = GenerationConfig(max_new_tokens=30, eos_token_ids=(eos,))
    ar = generate(adapter, p, cfg)
    sp = generate(adapter, p, cfg, DraftModelProposer(target, DraftLengthPolicy(length=8)))
    assert ar.output_ids == ar_free[: pos + 1] == sp.output_ids
    assert sp.finish_reason == ar.finish_reason == "eos"
    # the EOS sat inside an accepted block: the step that produced it was cut short
    assert max(sp.accept_lengths) <= 9 and sum(sp.accept_lengths) == pos + 1


@pytest.mark.parametrize("limit", [1, 2, 7, 9, 10])
def test_max_new_tokens_boundary(pair, limit):
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(3)
    ar = generate(adapter, p, GenerationConfig(max_new_tokens=limit))
    sp = generate(adapter, p, GenerationConfig(max_new_tokens=limit), DraftModelProposer(target, DraftLengthPolicy(4)))
    assert len(sp.output_ids) == limit == len(ar.output_ids)
    assert sp.output_ids == ar.output_ids
    assert sp.finish_reason == "length"


class _TreeProposer:
    """Proposes a 3-branch tree where only the middle branch follows the target's greedy path."""

    name, lossless, hidden_layers = "tree-test", True, ()

    def __init__(self, target, depth=3):
        self.adapter = ModelAdapter(target)
        self.depth = depth

    def reset(self, prompt_ids):
        pass

    def propose(self, tokens, max_tokens, sampling, generator=None):
        if max_tokens < self.depth * 3:
            return Draft.empty()
        seq, good = tokens, []
        for _ in range(self.depth):
            nxt = int(self.adapter.forward(seq[None]).logits[0, -1].argmax())
            good.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])
        toks, parents = [], []
        for b in range(3):
            for d in range(self.depth):
                tok = good[d] if b == 1 else (good[d] + 1 + b) % 128
                toks.append(tok)
                parents.append(-1 if d == 0 else len(toks) - 2)
        return Draft(tokens=torch.tensor(toks), parents=torch.tensor(parents))

    def observe(self, feedback):
        pass


def test_tree_draft_greedy_commits_the_matching_branch(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(11)
    ar = generate(adapter, p, GenerationConfig(max_new_tokens=20))
    sp = generate(adapter, p, GenerationConfig(max_new_tokens=20), _TreeProposer(target))
    assert sp.output_ids == ar.output_ids
    assert sp.accept_lengths[0] == 4  # the whole good branch + bonus
    assert sp.proposed_by_depth[:3] == [sp.accepted_by_depth[0]] * 3


PAD_EVERY_SIZE = tuple((n, n + 3) for n in range(2, 20))  # every verification forward gets 3 dummy rows


def test_padded_verification_commits_the_same_tokens_in_the_same_steps(pair):
    target, weak = pair
    adapter = ModelAdapter(target)
    padded = GenerationConfig(max_new_tokens=25, verify_padding=PAD_EVERY_SIZE)
    for seed in range(3):
        p = _prompt(seed)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=25))
        for make in (lambda: DraftModelProposer(weak, DraftLengthPolicy(length=4)), lambda: _TreeProposer(target)):
            plain = generate(adapter, p, GenerationConfig(max_new_tokens=25), make())
            pad = generate(adapter, p, padded, make())
            assert pad.output_ids == plain.output_ids == ar.output_ids
            assert pad.accept_lengths == plain.accept_lengths
            assert pad.accepted_by_depth == plain.accepted_by_depth


def test_padded_inputs_hide_the_dummy_rows_from_the_real_ones():
    from draftsmith.inference.core.generate import pad_rows, padded_inputs

    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)  # root, two children
    ids, pos, mask = padded_inputs(torch.tensor([5, 6, 7]), torch.tensor([[10, 11, 11]]), tree, 2)
    assert ids.tolist() == [5, 6, 7, 7, 7] and pos.tolist() == [[10, 11, 11, 12, 13]]
    assert torch.equal(mask[:3, :3], tree) and not mask[:3, 3:].any()  # no real row sees a dummy one
    assert mask[3:].tolist() == [[True, False, False, True, False], [True, False, False, False, True]]
    assert padded_inputs(torch.tensor([5, 6]), torch.tensor([[3, 4]]), None, 1)[2] is None  # causal: dummies last
    draft = Draft(tokens=torch.tensor([1, 2]), parents=torch.tensor([-1, 0]))
    assert pad_rows({3: 4}, draft) == 1 and pad_rows({}, draft) == 0 and pad_rows({3: 4}, Draft.empty()) == 0


def test_sampling_runs_and_respects_budget(pair):
    target, weak = pair
    adapter = ModelAdapter(target)
    cfg = GenerationConfig(max_new_tokens=20, sampling=SamplingParams(temperature=0.8, top_p=0.9, top_k=50))
    g = torch.Generator().manual_seed(0)
    res = generate(adapter, _prompt(1), cfg, DraftModelProposer(weak, DraftLengthPolicy(3)), generator=g)
    assert len(res.output_ids) == 20 and res.num_proposed > 0


def test_seeded_sampling_is_reproducible(pair):
    target, weak = pair
    adapter = ModelAdapter(target)
    cfg = GenerationConfig(max_new_tokens=15, sampling=SamplingParams(temperature=1.0))
    runs = [
        generate(adapter, _prompt(2), cfg, DraftModelProposer(weak), generator=torch.Generator().manual_seed(5)).output_ids
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_truncate():
    assert truncate([5, 6, 2, 7], 0, 10, (2,)) == ([5, 6, 2], "eos")
    assert truncate([5, 6, 7], 8, 10, (2,)) == ([5, 6], "length")
    assert truncate([5, 6], 0, 10, (2,)) == ([5, 6], None)
    assert truncate([5, 2], 9, 10, (2,)) == ([5], "length")


def test_stop_strings_cut_the_answer(pair):
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i % 26) for i in ids)

    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(4)
    free = generate(adapter, p, GenerationConfig(max_new_tokens=20)).output_ids
    text = Tok().decode(free)
    stop = text[6:8]
    first = text.find(stop)
    cfg = GenerationConfig(max_new_tokens=20, stop_strings=(stop,))
    sp = generate(adapter, p, cfg, DraftModelProposer(target), tokenizer=Tok())
    assert sp.finish_reason == "stop"
    assert sp.output_ids == free[: first + 2]


class _HiddenRecorder:
    """A proposer that records the hidden states the loop hands it (the EAGLE/Medusa seam)."""

    name, lossless, hidden_layers = "hidden-test", True, (1, -1)

    def __init__(self, target):
        self.inner = DraftModelProposer(target, DraftLengthPolicy(3))
        self.prompt_hidden, self.steps = None, []

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def prefill_hidden(self, hidden):
        self.prompt_hidden = hidden

    def propose(self, tokens, max_tokens, sampling, generator=None):
        return self.inner.propose(tokens, max_tokens, sampling, generator)

    def observe(self, feedback):
        self.steps.append(feedback)


def test_hidden_states_reach_the_proposer(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(9)
    rec = _HiddenRecorder(target)
    res = generate(adapter, p, GenerationConfig(max_new_tokens=10), rec)
    full = torch.cat([p, torch.tensor(res.output_ids)])
    ref = target(full[None], output_hidden_states=True)
    # prompt: all tokens but the pending one
    assert torch.allclose(rec.prompt_hidden[1], ref.hidden_states[1][0, : p.numel() - 1], atol=1e-5)
    # each step: the pending token and the accepted nodes, at their committed positions
    pos = p.numel() - 1
    for fb in rec.steps:
        n = 1 + fb.num_accepted
        assert fb.hidden_states[1].shape[0] == n
        assert torch.allclose(fb.hidden_states[1], ref.hidden_states[1][0, pos : pos + n], atol=1e-5)
        assert torch.allclose(fb.hidden_states[-1], ref.hidden_states[-1][0, pos : pos + n], atol=1e-4)
        assert fb.committed[: fb.num_accepted] == full[pos + 1 : pos + n].tolist()
        pos += len(fb.committed)


# --------------------------------------------------------------------------------------- extra inputs
class _WithExtras:
    """Wraps a proposer and appends ``m`` extra inputs with a random visibility and random
    position offsets to each draft; records what it proposed and what came back."""

    name, lossless, hidden_layers = "extras-test", True, ()

    def __init__(self, inner, m=3, as_embeds=False, seed=0):
        self.inner, self.m, self.as_embeds = inner, m, as_embeds
        self.g = torch.Generator().manual_seed(seed)
        self.steps = []

    def bind(self, target):
        self.view = target

    def reset(self, prompt_ids):
        self.inner.reset(prompt_ids)

    def propose(self, tokens, max_tokens, sampling, generator=None):
        d = self.inner.propose(tokens, max_tokens, sampling, generator)
        n, m = len(d), self.m
        ids = torch.randint(3, 128, (m,), generator=self.g)
        visible = torch.rand(m, 1 + n + m, generator=self.g) < 0.6
        depths = torch.randint(1, n + 3, (m,), generator=self.g)
        embeds = self.view.adapter.embed_tokens(ids) if self.as_embeds else None
        extra = ExtraInputs(visible, depths, None if self.as_embeds else ids, embeds, hidden_layers=(1, -1))
        draft = Draft(tokens=d.tokens, parents=d.parents, q=d.q, extra_inputs=extra)
        self.steps.append({"tokens": tokens.clone(), "draft": draft, "ids": ids})
        return draft

    def observe(self, feedback):
        self.steps[-1].update(feedback=feedback, cache=self.view.cache.lengths())
        self.inner.observe(feedback)


def _plain_forward_of_step(model, step):
    """The committed tokens, the draft and the extras in one plain forward (no cache), with the
    visibility and positions the step asked for: logits and hidden states of the extras."""
    tokens, d, ids = step["tokens"], step["draft"], step["ids"]
    past = tokens.numel() - 1
    n, m = len(d), len(ids)
    seq = torch.cat([tokens, d.tokens, ids])[None]  # [1, past + 1 + n + m]
    vis = torch.zeros(past + 1 + n + m, past + 1 + n + m, dtype=torch.bool)
    vis[:past, :past] = torch.ones(past, past, dtype=torch.bool).tril()
    vis[past:, :past] = True
    vis[past:, past:] = d.forward_mask  # [1 + n + m, 1 + n + m]: the tree (or chain), then the extras' rows
    pos = torch.cat([torch.arange(past), past + d.position_offsets])[None]
    out = model(seq, attention_mask=additive_mask(vis, torch.float32), position_ids=pos, output_hidden_states=True)
    return out.logits[0, -m:], out.hidden_states[1][0, -m:], out.hidden_states[-1][0, -m:]


@pytest.mark.parametrize("as_embeds", [False, True], ids=["ids", "embeds"])
def test_extra_inputs_get_the_logits_of_a_plain_forward(family, as_embeds):
    target = random_model(family, seed=0, layers=3, hidden=64)
    weak = random_model(family, seed=1, layers=1, hidden=32)
    adapter = ModelAdapter(target)
    for inner in (DraftModelProposer(weak, DraftLengthPolicy(3)), _TreeProposer(target, depth=2)):
        p = _prompt(5)
        ar = generate(adapter, p, GenerationConfig(max_new_tokens=14))
        prop = _WithExtras(inner, as_embeds=as_embeds)
        sp = generate(adapter, p, GenerationConfig(max_new_tokens=14), prop)
        assert sp.output_ids == ar.output_ids  # the extras change nothing in the answer
        for step in prop.steps:
            fb = step["feedback"]
            logits, h1, last = _plain_forward_of_step(target, step)
            assert fb.extra_logits.shape == (3, 128) and fb.target_logits.shape[0] == 1 + len(step["draft"])
            assert (fb.extra_logits - logits).abs().max() <= 1e-4
            assert (fb.extra_hidden[1] - h1).abs().max() <= 1e-5
            assert (fb.extra_hidden[-1] - last).abs().max() <= 1e-4
            # the cache keeps the pending token and the accepted nodes only: no extras, no rejected nodes
            past = step["tokens"].numel() - 1
            assert step["cache"] == [past + len(fb.committed)] * 3


def test_a_jacobi_block_after_a_chain_sees_the_chain(pair):
    """ExtraInputs.after_chain continues the draft: with the draft and the block on the greedy path,
    the block's logits are those of the plain causal forward over the whole continuation."""
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(2)
    ar = generate(adapter, p, GenerationConfig(max_new_tokens=8)).output_ids
    seen = {}

    class Block:
        name, lossless, hidden_layers = "jacobi-test", True, ()

        def reset(self, prompt_ids):
            pass

        def propose(self, tokens, max_tokens, sampling, generator=None):
            if seen:
                return Draft.empty()
            return Draft.chain(ar[:3], extra_inputs=ExtraInputs.after_chain(3, input_ids=torch.tensor(ar[3:6])))

        def observe(self, feedback):
            seen.setdefault("logits", feedback.extra_logits)

    generate(adapter, p, GenerationConfig(max_new_tokens=8), Block())
    full = target(torch.cat([p, torch.tensor(ar[:6])])[None]).logits[0, -3:]
    assert (seen["logits"] - full).abs().max() <= 1e-4


# --------------------------------------------------------------------------------------- stop strings
class _CharTok:
    """Token i decodes to one letter; counts the tokens it is asked to decode per call."""

    def __init__(self):
        self.calls = []

    def decode(self, ids, skip_special_tokens=True):
        self.calls.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)


def test_find_stop_returns_the_smallest_cut():
    tok = _CharTok()
    # context "ab", new "cdcd": "bc" is found with the first new token
    assert find_stop(tok, [0, 1], [2, 3, 2, 3], ("bc",)) == 1
    assert find_stop(tok, [0, 1], [2, 3, 2, 3], ("dc",)) == 3
    assert find_stop(tok, [0, 1], [2, 3], ("zz",)) is None
    assert find_stop(None, [0], [1], ("b",)) is None and find_stop(tok, [0], [1], ()) is None
    assert stop_lookback(("ab", "é")) == 3  # bytes of the longest stop string, plus one


def test_stop_string_across_a_step_boundary_is_cut_at_the_right_token(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    p = _prompt(4)
    free = generate(adapter, p, GenerationConfig(max_new_tokens=30)).output_ids
    text = _CharTok().decode(free)
    # AR commits one token per step, so a 3-letter stop string always spans steps; the perfect
    # draft commits 4 per step, so text[11:14] spans its step boundary at 12
    for proposer in (None, PromptLookupProposer(num_draft_tokens=4), DraftModelProposer(target, DraftLengthPolicy(3))):
        for at in (5, 11, 17):
            stop = text[at : at + 3]
            first = text.find(stop)
            cfg = GenerationConfig(max_new_tokens=30, stop_strings=(stop,))
            res = generate(adapter, p, cfg, proposer, tokenizer=_CharTok())
            assert res.finish_reason == "stop" and res.output_ids == free[: first + 3], (proposer, at)


def test_stop_string_search_decodes_a_bounded_window(pair):
    target, _ = pair
    adapter = ModelAdapter(target)
    tok = _CharTok()
    stops = ("STOP", "##")  # the tokenizer writes lowercase letters only: never found
    res = generate(adapter, _prompt(4), GenerationConfig(max_new_tokens=60, stop_strings=stops),
                   DraftModelProposer(target, DraftLengthPolicy(4)), tokenizer=tok)
    assert res.finish_reason == "length" and len(res.output_ids) == 60
    window = stop_lookback(stops) + max(res.accept_lengths)
    assert max(tok.calls) <= window  # never the whole answer
    assert len(tok.calls) == res.steps  # one decode per step when nothing matches
    assert sum(tok.calls) <= res.steps * window


def test_an_engines_stepping_changes_no_token(pair):
    """A serving engine's stepping (``draft_first_step=False, shorten_last_drafts=False``): no draft with the first new
    token (the prefill's), full-length drafts to the end (what the target accepts past max_new_tokens is counted,
    then cut); the answer is the same."""
    target, draft_model = pair
    adapter = ModelAdapter(target)
    for seed in range(3):
        p = _prompt(seed)
        plain = generate(adapter, p, GenerationConfig(max_new_tokens=13),
                         DraftModelProposer(draft_model, DraftLengthPolicy(length=4)))
        engine = generate(adapter, p, GenerationConfig(max_new_tokens=13, draft_first_step=False,
                                                           shorten_last_drafts=False),
                          DraftModelProposer(draft_model, DraftLengthPolicy(length=4)))
        assert engine.output_ids == plain.output_ids
        assert engine.accept_lengths[0] == 1  # the first step verified no draft
        steps_with_drafts = len(engine.accept_lengths) - 1
        assert engine.proposed_by_depth == [steps_with_drafts] * 4  # every later draft full length, even the last
