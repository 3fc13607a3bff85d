"""The decode runs of an evaluation: one question answered turn by turn, as one conversation.

Each answer becomes the assistant turn before the next user turn. A :class:`StepRecorder` around the
method's proposer records the draft length of every step, for the predicted-speedup metric.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.generate import GenerationConfig, GenerationResult, generate
from draftsmith.inference.core.proposer import Proposer
from draftsmith.inference.evaluation.questions import Question

# one transformers baseline run: (new token ids, seconds, target forwards)
HFRun = tuple[list[int], float, int]


@dataclass
class TurnRun:
    prompt_ids: list[int]
    result: GenerationResult
    text: str
    truncated: int = 0  # prompt tokens dropped from the left to fit the context
    draft_lengths: list[int] = field(default_factory=list)  # per step, 0 when nothing was proposed
    rejections: int = 0  # steps whose draft was not fully accepted
    steps: list[tuple[int, int]] = field(default_factory=list)  # (proposed, accepted) of the steps that drafted
    extra_rows: list[int] = field(default_factory=list)  # per step: the draft's own inputs in the forward (BiTA's masks)


@dataclass
class QuestionRun:
    question: Question
    method: list[TurnRun]
    ar: list[TurnRun]
    hf: dict[str, list[HFRun]] = field(default_factory=dict)  # baseline name -> one run per AR turn
    difference: dict | None = None  # where the method's answer first differs from AR (greedy only)
    original: list[TurnRun] | None = None  # AR of the original target, when the method verifies an adapted one


class StepRecorder:
    """Wraps a proposer and records how many nodes it proposed and got accepted at every step
    (composition: the wrapped proposer is untouched; other attributes are delegated to it)."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.name = inner.name
        self.lossless = getattr(inner, "lossless", True)
        self.hidden_layers = tuple(getattr(inner, "hidden_layers", ()) or ())
        self.steps: list[tuple[int, int]] = []  # (proposed, accepted) of the steps that proposed something
        self.extra_rows: list[int] = []  # every step: the extra inputs its draft added to the verification forward
        self._extra = 0

    def __getattr__(self, name: str):
        return getattr(self.__dict__["inner"], name)

    def reset(self, prompt_ids: torch.Tensor) -> None:  # prompt_ids: [L]
        self.steps, self.extra_rows = [], []
        self.inner.reset(prompt_ids)

    def propose(self, tokens, max_tokens, sampling, generator=None):
        draft = self.inner.propose(tokens, max_tokens, sampling, generator)
        self._extra = draft.num_extra
        return draft

    def observe(self, feedback) -> None:
        if feedback.num_proposed > 0:
            self.steps.append((feedback.num_proposed, feedback.num_accepted))
        self.extra_rows.append(self._extra)
        self.inner.observe(feedback)


# ---------------------------------------------------------------------------------------------- prompts


def chat_prompt_ids(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Prompt ids of ``messages`` through the tokenizer's chat template, generation prompt added."""
    from draftsmith.data.chat import build_prompt_ids

    return build_prompt_ids(tokenizer, messages)


def completion_prompt_ids(tokenizer, text: str) -> list[int]:
    """Prompt ids of a text continued as is (a completion question): the bos, if the tokenizer has one, and the
    text's tokens, special-token strings in it encoded as text."""
    from draftsmith.data.chat import text_ids

    ids, _ = text_ids(tokenizer, text)
    eos = getattr(tokenizer, "eos_token_id", None)
    return ids[:-1] if eos is not None and ids and ids[-1] == eos else ids


def question_prompt_ids(tokenizer, question: Question, messages: Sequence[dict]) -> list[int]:
    """The prompt of the turn after ``messages``: the chat template's, or a completion question's text as is."""
    return completion_prompt_ids(tokenizer, question.turns[0]) if question.completion else \
        chat_prompt_ids(tokenizer, messages)


def fit_prompt(ids: list[int], max_prompt: int, where: str = "") -> tuple[list[int], int]:
    """Keep the last ``max_prompt`` tokens (left truncation) with a warning; returns (ids, dropped)."""
    if len(ids) <= max_prompt:
        return ids, 0
    dropped = len(ids) - max_prompt
    warnings.warn(
        f"prompt{where} has {len(ids)} tokens, more than the {max_prompt} the context leaves after max_new_tokens: "
        f"dropped the first {dropped} (left truncation)",
        stacklevel=2,
    )
    return ids[dropped:], dropped


# ---------------------------------------------------------------------------------------------- answers


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _recorded_steps(steps: Sequence[tuple[int, int]], num_steps: int) -> tuple[list[int], int]:
    """(draft length of every one of ``num_steps`` steps, 0 where nothing was proposed; rejections)
    from the (proposed, accepted) pairs of the steps that proposed something."""
    lengths = [p for p, _ in steps]
    return lengths + [0] * max(0, num_steps - len(lengths)), sum(1 for p, a in steps if a < p)


def answer_question(
    target: ModelAdapter,
    tokenizer,
    question: Question,
    config: GenerationConfig,
    proposer: StepRecorder | None,
    seed: int,
    max_prompt: int,
) -> list[TurnRun]:
    """Answer every turn of ``question`` in one conversation; the answers become assistant turns."""
    messages: list[dict] = []
    turns: list[TurnRun] = []
    for t, user in enumerate(question.turns):
        messages.append({"role": "user", "content": user})
        ids, dropped = fit_prompt(question_prompt_ids(tokenizer, question, messages), max_prompt,
                                  f" of question {question.question_id} turn {t + 1}")
        gen = _generator(target.device, seed + t)
        res = generate(target, torch.tensor(ids, dtype=torch.long), config, proposer, generator=gen, tokenizer=tokenizer)
        text = tokenizer.decode(res.output_ids, skip_special_tokens=True)
        run = TurnRun(prompt_ids=ids, result=res, text=text, truncated=dropped)
        if proposer is not None:
            run.draft_lengths, run.rejections = _recorded_steps(proposer.steps, res.steps)
            run.steps = list(proposer.steps)
            run.extra_rows = list(proposer.extra_rows)
        turns.append(run)
        messages.append({"role": "assistant", "content": text})
    return turns


def warm_up(
    target: ModelAdapter,
    tokenizer,
    questions: Sequence[Question],
    n: int,
    config: GenerationConfig,
    proposer: StepRecorder | None,
    seed: int,
    max_prompt: int,
    baselines: Sequence[Callable[[list[int]], object]] = (),
) -> None:
    """``n`` unmeasured first-turn answers with AR, the method and every baseline (each called on the
    AR prompt ids)."""
    for i in range(n):
        q = questions[i % len(questions)]
        q1 = replace(q, turns=q.turns[:1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ar = answer_question(target, tokenizer, q1, config, None, seed, max_prompt)
            answer_question(target, tokenizer, q1, config, proposer, seed, max_prompt)
        for baseline in baselines:
            baseline(ar[0].prompt_ids)
