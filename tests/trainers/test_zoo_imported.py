"""A zoo around an imported real target (the smollm2 size), on a REDUCED spec: a tiny model stands in for the
import, so nothing is downloaded. The target is linked, the tokenizer is the target's, the draft starts from the
target's first layers with the embedding frozen, and records the tokens it drafts among."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers

from draftsmith.common.errors import ConfigError
from draftsmith.common.io import atomic_write_json, sha256_file
from draftsmith.data import zoo
from draftsmith.data.model_import import imported_dir
from draftsmith.data.tokenizer import train_tokenizer
from draftsmith.trainers.draft_layers import draft_from_target, grow_layers
from draftsmith.trainers.zoo import build_zoo

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b\n",
             "What is 12 plus 30? The answer is 42.", "Speculative decoding drafts tokens; the target verifies."]


def tiny_llama(vocab_size: int, layers: int = 3) -> transformers.PreTrainedModel:
    """A tied-embedding Llama like SmolLM2, a few thousand parameters."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def fake_import(home) -> transformers.PreTrainedModel:
    """Write a tiny model where the smollm2-135m import would be, as a finished import."""
    tokenizer = train_tokenizer(SENTENCES * 8, vocab_size=300, min_frequency=1, model_max_length=512)
    target = tiny_llama(len(tokenizer))
    out = imported_dir("smollm2-135m", home)
    target.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    atomic_write_json(out / "manifest.json", {"name": "smollm2-135m",
                                              "weights_sha256": sha256_file(out / "model.safetensors")})
    return target


def reduced_spec(vocab_size: int) -> zoo.ZooSpec:
    spec = zoo.zoo_spec("smollm2")
    return dataclasses.replace(
        spec,
        target=zoo.ModelSpec(layers=3, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=1, lr=1e-3),
        draft=zoo.ModelSpec(layers=1, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=64 * 4 * 3, lr=3e-3,
                            warmup_steps=1, init_from_target=True, freeze_embeddings=True, draft_vocab=40),
        vocab_size=vocab_size, seq_len=64, batch_size=4, max_positions=512, checkpoint_every=2, eval_tokens=600,
        max_train_examples=150, eval_batch_size=4,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch.set_num_threads(1)
    home = tmp_path_factory.mktemp("home")
    target = fake_import(home)
    spec = reduced_spec(target.config.vocab_size)
    out = build_zoo("smollm2", home=home, spec=spec, threads=1, progress=False)
    return home, out, target, spec


def test_target_is_linked_and_tokenizer_is_the_targets(built):
    home, out, target, _ = built
    assert (out / "target").is_symlink()
    assert (out / "target").resolve() == imported_dir("smollm2-135m", home).resolve()
    manifest = zoo.read_zoo_manifest("smollm2", home)
    assert manifest["models"]["target"]["imported"] == "smollm2-135m"
    assert manifest["models"]["target"]["tokens_seen"] == 0
    assert manifest["models"]["target"]["heldout_loss"] > 0
    assert manifest["tokenizer"]["source"] == "smollm2-135m"
    tok = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
    src = transformers.AutoTokenizer.from_pretrained(imported_dir("smollm2-135m", home))
    assert tok.get_vocab() == src.get_vocab()


def test_draft_starts_from_the_target_keeps_its_embedding_and_records_its_vocabulary(built):
    home, out, target, _ = built
    draft = transformers.AutoModelForCausalLM.from_pretrained(out / "draft")
    assert draft.config.num_hidden_layers == 1
    assert torch.equal(draft.get_input_embeddings().weight, target.get_input_embeddings().weight)  # frozen
    assert not torch.equal(draft.model.layers[0].mlp.up_proj.weight, target.model.layers[0].mlp.up_proj.weight)
    vocab = draft.config.draft_vocab
    assert vocab == sorted(vocab) and 40 <= len(vocab) <= 40 + 10
    tok = transformers.AutoTokenizer.from_pretrained(out / "tokenizer")
    assert set(tok.all_special_ids) <= set(vocab)  # the end of an answer can always be drafted
    record = zoo.read_zoo_manifest("smollm2", home)["models"]["draft"]
    assert record["draft_vocab"] == len(vocab) and 0 < record["draft_vocab_coverage"] <= 1
    assert "draft_vocab" not in record["config"]


def test_rerun_returns_the_built_zoo(built):
    home, out, _, spec = built
    before = sha256_file(out / "draft" / "model.safetensors")
    assert build_zoo("smollm2", home=home, spec=spec, threads=1, progress=False) == out
    assert sha256_file(out / "draft" / "model.safetensors") == before


def test_draft_from_target_copies_the_first_layers():
    target = tiny_llama(300)
    m = zoo.ModelSpec(layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=1, lr=1e-3,
                      freeze_embeddings=True)
    draft = draft_from_target(target, m)
    assert draft.config.num_hidden_layers == 2
    for i in range(2):
        for a, b in zip(draft.model.layers[i].parameters(), target.model.layers[i].parameters(), strict=True):
            assert torch.equal(a, b)
    assert torch.equal(draft.model.norm.weight, target.model.norm.weight)
    assert not draft.get_input_embeddings().weight.requires_grad
    assert draft.get_output_embeddings().weight is draft.get_input_embeddings().weight  # still tied
    with pytest.raises(ConfigError, match="init_from_target"):
        draft_from_target(target, dataclasses.replace(m, hidden=64, heads=4))


def test_a_grown_draft_starts_as_the_draft_it_grew_from():
    target = tiny_llama(300, layers=4)
    m = zoo.ModelSpec(layers=1, hidden=32, intermediate=64, heads=4, kv_heads=2, tokens=1, lr=1e-3)
    draft = draft_from_target(target, m)
    with torch.no_grad():  # a trained draft: its layer and norm no longer the target's
        for p in draft.model.layers[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    draft.config.draft_vocab = [0, 1, 2, 7, 9]
    grown = grow_layers(draft, target, 3)
    assert grown.config.num_hidden_layers == 3 and grown.config.draft_vocab == [0, 1, 2, 7, 9]
    ids = torch.randint(3, 300, (2, 12))
    with torch.no_grad():
        assert torch.allclose(grown(ids).logits, draft(ids).logits, atol=1e-6)  # the new blocks are identities
    for a, b in zip(grown.model.layers[0].parameters(), draft.model.layers[0].parameters(), strict=True):
        assert torch.equal(a, b)
    for i in (1, 2):  # the target's layers 1 and 2, their residual writers zeroed
        new, old = grown.model.layers[i], target.model.layers[i]
        assert not new.self_attn.o_proj.weight.any() and not new.mlp.down_proj.weight.any()
        assert torch.equal(new.self_attn.q_proj.weight, old.self_attn.q_proj.weight)
        assert torch.equal(new.mlp.up_proj.weight, old.mlp.up_proj.weight)
        assert torch.equal(new.input_layernorm.weight, old.input_layernorm.weight)
    assert grown.get_output_embeddings().weight is grown.get_input_embeddings().weight  # still tied
    # one step of training moves the zeroed writers, after which the new layers compute something
    loss = torch.nn.functional.cross_entropy(grown(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert grown.model.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0


def test_grow_layers_refuses_what_it_cannot_grow():
    target = tiny_llama(300, layers=3)
    draft = draft_from_target(target, zoo.ModelSpec(layers=2, hidden=32, intermediate=64, heads=4, kv_heads=2,
                                                    tokens=1, lr=1e-3))
    with pytest.raises(ConfigError, match="does not grow the draft"):
        grow_layers(draft, target, 2)
    with pytest.raises(ConfigError, match="exceeds the target's 3 layers"):
        grow_layers(draft, target, 4)
    narrow = tiny_llama(300, layers=1)
    narrow.config.hidden_size = 16
    with pytest.raises(ConfigError, match="target's hidden_size"):
        grow_layers(narrow, target, 2)


def test_frequent_tokens():
    rows = torch.tensor([[5, 5, 5, 7, 7, 9], [5, 7, 1, 1, 1, 1]])
    ids, coverage = zoo.frequent_tokens(rows, 12, 2, always=[0, 2])
    assert ids == [0, 1, 2, 5]
    assert coverage == pytest.approx(8 / 12)


def test_init_from_target_needs_an_imported_target():
    with pytest.raises(ConfigError, match="target_import"):
        dataclasses.replace(zoo.zoo_spec("tiny"), draft=dataclasses.replace(zoo.zoo_spec("tiny").draft,
                                                                           init_from_target=True))
