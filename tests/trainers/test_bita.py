"""BiTA training: the masks' training-time logits are exactly what decoding computes for the same context, the
insertion points, and the loss."""

import pytest
import torch
import torch.nn.functional as F

from draftsmith.data.tiny_models import LAYOUT_FAMILIES, random_model
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import verify_forward
from draftsmith.inference.core.verify import Draft, ExtraInputs
from draftsmith.inference.drafters.bita import BitaEmbeddings, decode_extras_layout
from draftsmith.trainers.bita.trainer import BitaTraining, chain_tau, insertion_points, sequence_kv


@pytest.fixture(params=LAYOUT_FAMILIES)
def family(request):  # the proposers' logic on one family of each layout
    return request.param


def test_training_masks_see_what_decoding_masks_see(family):
    """Group after token t in training == group 0 of a decoding step whose pending token is x_t."""
    model = random_model(family, seed=0, layers=2, hidden=32)
    adapter = ModelAdapter(model)
    emb = BitaEmbeddings.for_target(model, prompt_tokens=3, mask_tokens=2)
    emb.init_from_target(adapter, seed=1)
    module = BitaTraining(emb)
    seq = torch.randint(3, 100, (1, 9), generator=torch.Generator().manual_seed(0))
    labels = seq.clone()
    points = torch.tensor([[3, 6]])
    with torch.no_grad():
        keys, values = sequence_kv(adapter, seq)
        hidden, targets = module.mask_hidden(adapter, points, labels, keys, values)  # [1, 4, H]
        logits = adapter.logits(hidden)  # [1, 4, V]
        assert targets.tolist() == [[seq[0, 5].item(), seq[0, 6].item(), seq[0, 8].item(), -100]]
        for g, t in enumerate((3, 6)):
            cache = adapter.new_cache(16)
            adapter.forward(seq[:, :t], cache, compute_logits=False)  # x_0 .. x_{t-1}; x_t pending
            visible, depths = decode_extras_layout([], 2)
            prefix = emb.prefix_kv(adapter)
            draft = Draft.chain([], extra_inputs=ExtraInputs(visible, depths, inputs_embeds=emb.mask_inputs(1),
                                                              prefix=prefix))
            out = verify_forward(adapter, cache, t, seq[0, t:t + 1], draft)
            assert (out.logits[0, 1:] - logits[0, 2 * g: 2 * g + 2]).abs().max() <= 1e-4


def test_insertion_points_lie_in_the_answer():
    labels = torch.tensor([[-100, -100, -100, 5, 6, 7, 8, -100], [-100] * 8])
    points = insertion_points(labels, groups=10, generator=torch.Generator().manual_seed(0))
    # x_{t+2} labelled: t in 1..4 for the first row; nothing for the second
    assert points[0].tolist() == [1, 2, 3, 4] + [-1] * 6 and points[1].tolist() == [-1] * 10


def test_chain_tau():
    assert chain_tau([1.0, 1.0]) == 3.0 and chain_tau([0.5, 0.5]) == 1.75 and chain_tau([]) == 1.0


def test_loss_is_the_full_logits_cross_entropy_in_value_and_gradients():
    """The masks' CE chunked over the vocabulary against ``cross_entropy`` of their full [G*M, V] logits: the same
    value and the same gradients for the prompt and mask embeddings (the only trained tensors)."""
    model = random_model("llama", seed=0, layers=2, hidden=32)
    adapter = ModelAdapter(model)
    emb = BitaEmbeddings.for_target(model, prompt_tokens=3, mask_tokens=2)
    emb.init_from_target(adapter, seed=1)
    module = BitaTraining(emb)
    seq = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(2))
    labels = seq.clone()
    labels[:, :3] = -100
    points = insertion_points(labels, groups=3, generator=torch.Generator().manual_seed(3))
    keys, values = sequence_kv(adapter, seq)
    got = module(adapter, points, labels, keys, values)
    hidden, targets = module.mask_hidden(adapter, points, labels, keys, values)
    logits = adapter.logits(hidden)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100,
                           reduction="sum")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    params = [p for p in module.parameters() if p.requires_grad]
    assert params
    for g, w in zip(torch.autograd.grad(got, params), torch.autograd.grad(want, params)):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
