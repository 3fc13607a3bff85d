"""Prompts split off labelled rows, left padding, EOS cuts and rows rebuilt from generated answers."""

import torch

from draftsmith.data.generation import cut_at_eos, left_pad, sequences_from_generations, split_prompts


def test_split_prompts_chat_and_text_rows():
    ids = torch.tensor([[1, 9, 9, 5, 6, 0], [1, 2, 3, 4, 5, 6]])
    labels = torch.tensor([[-100, -100, -100, 5, 6, -100], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert split_prompts(ids, labels, mask, prompt_tokens=2) == [[1, 9, 9], [1, 2]]
    assert split_prompts(ids, labels, mask, prompt_tokens=50)[1] == [1, 2, 3, 4, 5]  # keeps >= 1 token to predict



def test_generation_helpers():
    assert cut_at_eos([4, 5, 2, 6, 2], eos_ids=[2]) == [4, 5, 2]
    assert cut_at_eos([4, 5], eos_ids=[2]) == [4, 5]
    ids, mask = left_pad([[3, 4, 5], [6]], pad_token_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[3, 4, 5], [0, 0, 6]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    rows = sequences_from_generations([[1, 2]], [[7, 8, 2]])
    assert rows == [{"input_ids": [1, 2, 7, 8, 2], "labels": [-100, -100, 7, 8, 2], "attention_mask": [1] * 5}]

