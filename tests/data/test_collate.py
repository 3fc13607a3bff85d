"""Right padding of training rows and the positions a loss counts."""

import torch

from draftsmith.data.collate import PadCollator, response_mask


def test_pad_collator_pads_right_with_ignore_labels():
    batch = PadCollator(pad_token_id=0)([
        {"input_ids": [5, 6, 7], "labels": [-100, 6, 7], "attention_mask": [1, 1, 1]},
        {"input_ids": [8], "labels": [8]},
    ])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert PadCollator(0, pad_to_multiple_of=4)([{"input_ids": [1, 2, 3, 4, 5]}])["input_ids"].shape == (1, 8)



def test_response_mask_is_shifted_by_one():
    labels = torch.tensor([[-100, -100, 7, 8, -100]])
    # logits at t predict token t + 1: positions 1 and 2 predict the labelled tokens 2 and 3
    assert response_mask(labels).tolist() == [[False, True, True, False]]

