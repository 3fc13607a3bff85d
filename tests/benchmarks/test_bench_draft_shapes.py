"""The draft-shape benchmark: the expected-speedup rule and the cost measurement on a tiny model."""

import pytest

from draftsmith.data.tiny_models import random_model


@pytest.fixture(scope="module")
def shapes(script_loader):
    return script_loader("bench_draft_shapes")


def test_expected_speedup_picks_the_best_draft_length(shapes):
    flat = {n: 1.0 for n in range(1, 10)}  # verification as cheap as one token
    speedup, gamma = shapes.expected_speedup(0.0, flat, 0.8)  # free draft, flat verification: draft the most
    assert gamma == 8 and speedup == pytest.approx((1 - 0.8**9) / 0.2)
    steep = {n: float(n) for n in range(1, 10)}  # verification costs n steps: never pays
    speedup, _ = shapes.expected_speedup(0.1, steep, 0.5)
    assert speedup < 1.0


def test_decode_ms_with_and_without_a_head_subset(shapes):
    model = random_model("llama", seed=0, vocab_size=300, layers=1, hidden=32)
    head = model.get_output_embeddings().weight[:50].detach().clone()
    assert shapes.decode_ms(model, context=8, repeats=2) > 0
    assert shapes.decode_ms(model, head, context=8, repeats=2) > 0
