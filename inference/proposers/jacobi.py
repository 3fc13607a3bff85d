"""Jacobi decoding as a proposer (Santilli et al. 2023; CLLM, Kou et al. 2024): the draft of each step is the
current guess of the next ``block`` tokens, and the same verification forward that checks it produces the next
guess.

One step runs the target over ``[pending, g_1 .. g_n]``; greedy verification accepts the leading guesses that
equal the target's argmax and commits one more token (the argmax after them), exactly as plain decoding would.
The argmaxes at the rows after the accepted ones are the Jacobi update of the rest of the block (each position
re-predicted from the current guess before it); they become the next guess, topped up to ``block`` tokens with
tokens drawn from the context (CLLM's initialisation). The fixed point of the iteration is the greedy answer, so
the output is exact by construction; a model trained by CLLM's consistency loss reaches it in fewer steps.

Counted as the CLLM paper counts (its "fast-forwarded" and "stationary" tokens), per accepted guess token:

- *stationary*: it already held the same value at the same position in the previous guess, i.e. it was right
  and stayed put while a token before it was still wrong;
- *fast-forwarded*: it became right in the last update and was fixed in the same forward as the tokens before
  it (several tokens in one iteration).

The evaluator puts both, per ``block`` generated tokens, in the report (:meth:`JacobiProposer.report_section`).
"""

from __future__ import annotations

import torch

from draftsmith.common.errors import ConfigError
from draftsmith.inference.core.proposer import StepFeedback
from draftsmith.inference.core.sampling import SamplingParams
from draftsmith.inference.core.verify import Draft


class JacobiProposer:
    name = "jacobi"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(self, block: int = 16, seed: int = 0) -> None:
        if block < 1:
            raise ConfigError(f"--draft-length {block}: a Jacobi block needs at least 1 token")
        self.block, self.seed = int(block), int(seed)
        self._guess: torch.Tensor = torch.empty(0, dtype=torch.long)  # [g] guesses for the positions after the pending
        self._previous: dict[int, int] = {}  # absolute position -> token of the last guess
        self._position = 0  # absolute position of the pending token
        self._context: list[int] = []  # the committed tokens on the host (extended by observe: no device read)
        self._generator = torch.Generator().manual_seed(self.seed)
        self.reset_stats()

    def reset_stats(self) -> None:
        self.stats = {"steps": 0, "committed": 0, "accepted": 0, "fast_forwarded": 0, "stationary": 0}

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._guess, self._previous = torch.empty(0, dtype=torch.long), {}
        self._position = prompt_ids.numel() - 1
        self._context = prompt_ids.reshape(-1).tolist()
        self._generator.manual_seed(self.seed)

    def _fill(self, n: int) -> list[int]:
        """``n`` tokens drawn from the context (the prompt and what was committed), CLLM's initial guess."""
        if not self._context or n <= 0:
            return [0] * max(n, 0)
        pick = torch.randint(0, len(self._context), (n,), generator=self._generator)
        return torch.tensor(self._context)[pick].tolist()

    def propose(self, tokens: torch.Tensor, max_tokens: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        if not sampling.greedy:
            raise ConfigError("Jacobi decoding is greedy (its fixed point is the greedy answer): use --temperature 0")
        if len(self._context) != tokens.numel():  # observe was not told every step: read the sequence once
            self._context = tokens.reshape(-1).tolist()
        self._position = tokens.numel() - 1
        n = max(0, min(self.block, max_tokens))
        kept = self._guess[:n]  # [<= n] the last update, on the target's device
        fill = self._fill(n - kept.numel())
        guess = torch.cat([kept, torch.tensor(fill, dtype=torch.long, device=kept.device)]) if fill else kept
        self._guess = guess
        return Draft.chain(guess)

    def observe(self, feedback: StepFeedback) -> None:
        a, n = feedback.num_accepted, feedback.num_proposed
        pos = self._position
        guess = feedback.draft_tokens  # the guess as read with the verdict
        if guess is None or len(guess) != self._guess.numel():
            guess = self._guess.tolist()
        stationary = sum(1 for i in range(a) if self._previous.get(pos + 1 + i) == guess[i])
        self._context.extend(feedback.committed)
        self.stats["steps"] += 1
        self.stats["committed"] += len(feedback.committed)
        self.stats["accepted"] += a
        self.stats["stationary"] += stationary
        self.stats["fast_forwarded"] += a - stationary
        self._previous = {pos + 1 + i: t for i, t in enumerate(guess)}
        rows = feedback.target_logits[a + 1: n + 1] if feedback.target_logits is not None else None  # [n - a, V]
        self._guess = rows.argmax(-1) if rows is not None and rows.numel() else torch.empty(0, dtype=torch.long)

    def report_section(self) -> tuple[str, dict]:
        """``("jacobi", {...})``: the block size and, per ``block`` generated tokens, the fast-forwarded and the
        stationary tokens (module docstring), with the totals."""
        s = self.stats
        blocks = max(1e-9, s["committed"] / self.block)
        return "jacobi", {"block": self.block, **s,
                          "fast_forwarded_per_block": s["fast_forwarded"] / blocks,
                          "stationary_per_block": s["stationary"] / blocks}


__all__ = ["JacobiProposer"]
