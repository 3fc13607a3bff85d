import pytest

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.generate import GenerationConfig
from draftsmith.inference.evaluation.questions import Question
from draftsmith.inference.evaluation.runs import StepRecorder, answer_question, chat_prompt_ids, fit_prompt, warm_up
from draftsmith.inference.proposers.draft_model import DraftModelProposer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_multi_turn_conversation_carries_the_answer(lm_pair, chat_tokenizer):
    target, _ = lm_pair
    q = Question(5, "chat", ("Hello, how are you?", "Tell me about the fox."))
    turns = answer_question(ModelAdapter(target), chat_tokenizer, q, GenerationConfig(max_new_tokens=6), None, 0, 400)
    assert len(turns) == 2
    first = [{"role": "user", "content": q.turns[0]}]
    assert turns[0].prompt_ids == chat_prompt_ids(chat_tokenizer, first)
    second = first + [{"role": "assistant", "content": turns[0].text}, {"role": "user", "content": q.turns[1]}]
    assert turns[1].prompt_ids == chat_prompt_ids(chat_tokenizer, second)
    assert turns[0].text == chat_tokenizer.decode(turns[0].result.output_ids, skip_special_tokens=True)


def test_fit_prompt_keeps_the_last_tokens_with_a_warning():
    assert fit_prompt([1, 2, 3], 3) == ([1, 2, 3], 0)
    with pytest.warns(UserWarning, match="left truncation"):
        assert fit_prompt([1, 2, 3, 4, 5], 2, " of question 1 turn 1") == ([4, 5], 3)


def test_step_recorder_records_draft_lengths_and_rejections(lm_pair, chat_tokenizer):
    target, draft = lm_pair
    recorder = StepRecorder(DraftModelProposer(draft, DraftLengthPolicy(length=3)))
    assert recorder.name == "draft" and recorder.policy.length == 3  # other attributes are delegated
    q = Question(1, "x", ("Hello world",))
    (turn,) = answer_question(ModelAdapter(target), chat_tokenizer, q, GenerationConfig(max_new_tokens=8), recorder, 0, 400)
    assert len(turn.draft_lengths) == turn.result.steps
    assert sum(turn.draft_lengths) == turn.result.num_proposed
    assert turn.rejections == sum(1 for p, a in recorder.steps if a < p)


def test_warm_up_calls_every_baseline_on_the_first_turn_prompt(lm_pair, chat_tokenizer):
    target, _ = lm_pair
    q = Question(5, "chat", ("Hello, how are you?", "Tell me about the fox."))
    seen: list[list[int]] = []
    warm_up(ModelAdapter(target), chat_tokenizer, [q], 2, GenerationConfig(max_new_tokens=4), None, 0, 400,
            [seen.append])
    first = chat_prompt_ids(chat_tokenizer, [{"role": "user", "content": q.turns[0]}])
    assert seen == [first, first]


def test_a_completion_question_continues_its_text_without_the_chat_template(lm_pair, chat_tokenizer):
    """A base model's prompt: the bos and the text's tokens, no template, no end of sequence; the method's answer is
    AR's."""
    target, draft = lm_pair
    q = Question("o1", "prose", ("The quick brown fox",), completion=True)
    config = GenerationConfig(max_new_tokens=8)
    ar = answer_question(ModelAdapter(target), chat_tokenizer, q, config, None, 0, 400)
    text = chat_tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"]
    assert ar[0].prompt_ids == [chat_tokenizer.bos_token_id, *text]
    proposer = StepRecorder(DraftModelProposer(draft, DraftLengthPolicy(3)))
    spec = answer_question(ModelAdapter(target), chat_tokenizer, q, config, proposer, 0, 400)
    assert spec[0].result.output_ids == ar[0].result.output_ids
