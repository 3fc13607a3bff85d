import pytest
import torch
from host_reads import HostReads

from draftsmith.inference.core.kv_cache import KVCache


def _kv(t, fill):
    return torch.full((1, 2, t, 4), float(fill)), torch.full((1, 2, t, 4), float(-fill))


def test_update_grows_and_returns_all_entries():
    c = KVCache(num_layers=2, capacity=2)
    k, v = c.update(*_kv(3, 1), layer_idx=0)
    assert k.shape == (1, 2, 3, 4)
    k, v = c.update(*_kv(2, 2), layer_idx=0)
    assert k.shape == (1, 2, 5, 4) and k[0, 0, :, 0].tolist() == [1, 1, 1, 2, 2]
    assert v[0, 0, :, 0].tolist() == [-1, -1, -1, -2, -2]
    assert c.get_seq_length(0) == 5 and c.get_seq_length(1) == 0


def test_crop_and_select():
    c = KVCache(num_layers=1)
    for i in range(6):
        c.update(*_kv(1, i), layer_idx=0)
    c.select(2, torch.tensor([1, 3]))  # keep positions 3 and 5 after the prefix [0, 1]
    k, _ = c.layer(0)
    assert k[0, 0, :, 0].tolist() == [0, 1, 3, 5]
    c.crop(1)
    assert c.get_seq_length() == 1
    c.select(1, torch.tensor([], dtype=torch.long))
    assert c.get_seq_length() == 1
    with pytest.raises(ValueError):
        c.crop(-1)


def test_select_contiguous_is_a_crop():
    c = KVCache(num_layers=1)
    c.update(*_kv(5, 7), layer_idx=0)
    c.select(1, torch.tensor([0, 1]))
    assert c.get_seq_length() == 3


def test_select_rejects_out_of_range():
    c = KVCache(num_layers=1)
    c.update(*_kv(3, 1), layer_idx=0)
    with pytest.raises(IndexError):
        c.select(1, torch.tensor([0, 5]))


def test_lengths_per_layer():
    c = KVCache(num_layers=3)
    c.update(*_kv(4, 1), layer_idx=0)
    c.update(*_kv(2, 1), layer_idx=2)
    assert c.lengths() == [4, 0, 2]
    lengths = c.lengths()
    lengths[0] = 99  # a copy: the cache is not changed through it
    assert c.get_seq_length(0) == 4
    c.crop(3)
    assert c.lengths() == [3, 0, 2]


def test_select_reads_its_offsets_on_the_host_and_copies_an_index_to_the_device_once_or_never():
    """A tree's accepted branch is kept with the offsets as host ints and the index on the device: given there
    (the decode loop's, from the verdict), nothing is copied; else one copy for every layer, not one per layer."""
    for given in (True, False):
        with HostReads() as counter:
            c = KVCache(num_layers=3)
            for layer in range(3):
                for i in range(6):
                    c.update(torch.full((1, 2, 1, 4), float(i), device="cpu"), torch.zeros(1, 2, 1, 4, device="cpu"),
                             layer_idx=layer)
            index = torch.tensor([1, 3], device="cpu") if given else None
            counter.reset()
            c.select(2, [1, 3], index)
        assert (counter.reads, counter.uploads) == (0, 0 if given else 1)
        assert all(c.layer(i)[0][0, 0, :, 0].tolist() == [0, 1, 3, 5] for i in range(3))
