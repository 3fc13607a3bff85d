"""A separate, smaller draft model with its own KV cache (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from draftsmith.common.errors import ConfigError, TokenizerMismatchError
from draftsmith.common.models import tokenizer_sha256
from draftsmith.inference.core.adapter import ModelAdapter
from draftsmith.inference.core.draft_length import DraftLengthPolicy
from draftsmith.inference.core.proposer import StepFeedback, common_prefix_length
from draftsmith.inference.core.sampling import SamplingParams, process_logits
from draftsmith.inference.core.verify import Draft


def check_same_tokenizer(
    target_model, draft_model, target_tokenizer=None, draft_tokenizer=None, target_name="target", draft_name="draft"
) -> None:
    """Refuse a draft whose vocabulary or tokenizer differs from the target's."""
    tv = ModelAdapter(target_model).vocab_size
    dv = ModelAdapter(draft_model).vocab_size
    if tv != dv:
        raise TokenizerMismatchError(
            f"the draft {draft_name} has a vocabulary of {dv} tokens but the target {target_name} has {tv}: "
            "a draft must use the target's tokenizer (train or pick a draft from the same tokenizer family)"
        )
    if target_tokenizer is not None and draft_tokenizer is not None:
        if tokenizer_sha256(target_tokenizer, chat_template=False) != tokenizer_sha256(draft_tokenizer, chat_template=False):
            raise TokenizerMismatchError(
                f"the draft {draft_name} and the target {target_name} have different tokenizers "
                "(same size, different tokens): use a draft trained with the target's tokenizer"
            )


def draft_vocab_of(draft_model) -> torch.Tensor | None:
    """The token ids a draft was built to propose (``config.draft_vocab``, written by the zoo build), or None."""
    ids = getattr(draft_model.config, "draft_vocab", None)
    return torch.tensor(sorted(ids), dtype=torch.long) if ids else None


def vocab_mask(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:  # [K] -> [V] bool, on ids' device
    """Which of ``vocab_size`` token ids are among ``ids``."""
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=ids.device)
    mask[ids] = True
    return mask


def head_rows(lm_head: torch.nn.Module, vocab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(weight [K, H], bias [K] or None)``: the LM head's rows of the ``vocab`` tokens, copied once."""
    bias = getattr(lm_head, "bias", None)
    return lm_head.weight[vocab].detach().clone(), None if bias is None else bias[vocab].detach().clone()


def scatter_rows(q: torch.Tensor, vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A distribution over ``vocab`` ([K]) as one over the whole vocabulary ([V], zero elsewhere)."""
    return q.new_zeros(vocab_size).scatter_(0, vocab, q)


class DraftModelProposer:
    """Drafts a chain autoregressively with a small causal LM that shares the target's tokenizer.

    Its cache holds the committed tokens it has already seen plus its own earlier proposals; on
    each call it keeps the prefix that still agrees with the committed tokens, feeds the rest in one
    forward and then drafts one token per forward.

    ``confidence_threshold`` ends a draft early: after a token whose draft probability (at
    temperature 1, or under the sampling parameters when sampling) is below the threshold, the
    draft stops there, because the tokens after an unlikely one are rarely accepted and each costs a
    draft forward (transformers' ``assistant_confidence_threshold``). Whether to stop depends only
    on the draft's own tokens, so verification stays exact; 0 disables it.

    ``vocab`` (sorted token ids, ``[K]``) restricts drafting to those tokens: each draft step computes only
    ``K`` rows of the LM head, which on a large vocabulary is most of a small draft's cost. The draft's
    distribution is then the softmax over those rows (zero elsewhere); verification is unchanged, so decoding
    stays exact, only a token outside ``vocab`` can never be proposed (:func:`draft_vocab_of`)."""

    name = "draft"
    lossless = True
    hidden_layers: tuple[int, ...] = ()

    def __init__(
        self,
        draft_model,
        policy: DraftLengthPolicy | None = None,
        confidence_threshold: float = 0.0,
        vocab: torch.Tensor | None = None,  # [K] token ids the draft may propose; None = all
    ) -> None:
        if not 0.0 <= confidence_threshold < 1.0:
            raise ConfigError(f"confidence_threshold must be in [0, 1) (0 = off), got {confidence_threshold}")
        self.adapter = ModelAdapter(draft_model)
        self.policy = policy or DraftLengthPolicy()
        self.confidence_threshold = float(confidence_threshold)
        self.record_confidences = False  # keep every drafted token's draft probability (the tuner reads it)
        self.last_confidences: list[float] = []  # of the last draft, when recorded
        self._cache = None
        self._ids: list[int] = []
        self._committed: list[int] = []
        self.vocab = None if vocab is None else vocab.to(self.adapter.device)  # [K]
        self._head_rows = None if vocab is None else head_rows(self.adapter.lm_head, self.vocab)  # (W [K, H], b)
        self._inside = None if vocab is None else vocab_mask(self.vocab, self.adapter.vocab_size)  # [V] proposable
        self.reset_stats()

    @property
    def draft_model(self):
        """The separate draft model this proposer runs (transformers' assisted generation takes it)."""
        return self.adapter.model

    def reset_stats(self) -> None:
        self.stats = {"committed": 0, "outside": 0}  # outside: committed tokens the draft could not propose
        self._outside: torch.Tensor | None = None  # [] the outside count summed on the device, read when reported

    def report_section(self) -> tuple[str, dict]:
        """``("draft_vocab", {...})``: the draft's vocabulary size (``"all"`` without one) and the share of the
        committed tokens outside it, which no draft could have proposed."""
        size = "all" if self.vocab is None else int(self.vocab.numel())
        if self._outside is not None:  # the one read of the count, at report time
            self.stats["outside"] += int(self._outside)
            self._outside = None
        committed = self.stats["committed"]
        return "draft_vocab", {"size": size, "committed_tokens": committed,
                               "outside_fraction": self.stats["outside"] / max(1, committed)}

    def _next_logits(self, feed: torch.Tensor) -> torch.Tensor:  # feed [m] -> [V], or [K] over self.vocab
        if self._head_rows is None:
            return self.adapter.forward(feed[None], self._cache, compute_logits=slice(-1, None)).logits[0, -1]
        last = self.adapter.forward(feed[None], self._cache, compute_logits=False).last_hidden[0, -1]  # [H]
        return F.linear(last, *self._head_rows).float()  # [K]

    def reset(self, prompt_ids: torch.Tensor) -> None:
        self._cache = self.adapter.new_cache(capacity=max(256, 2 * prompt_ids.numel()))
        self._ids: list[int] = []  # the tokens in the draft's cache (known on the host)
        self._unread: torch.Tensor | None = None  # [k] the last chain, on the device: its first k - 1 follow _ids
        self._committed: list[int] = prompt_ids.reshape(-1).tolist()  # the sequence, kept on the host by observe()
        self.policy.reset()

    def _host_tokens(self, tokens: torch.Tensor) -> list[int]:
        """The committed sequence as host ints: the copy :meth:`observe` keeps (no device read), else read once."""
        if len(self._committed) != tokens.numel():
            self._committed = tokens.tolist()
        return self._committed

    def propose(
        self,
        tokens: torch.Tensor,  # [L]
        max_tokens: int,
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Draft:
        k = min(self.policy.next_length(), max_tokens, self.adapter.max_positions - tokens.numel())
        self._unread = None
        if k <= 0:
            return Draft.empty()
        host = self._host_tokens(tokens)
        keep = common_prefix_length(self._ids, host[:-1])  # the pending token is always re-fed
        self._cache.crop(keep)
        feed = tokens[keep:]  # [m], ends with the pending token
        if self.confidence_threshold > 0 or self.record_confidences:
            drafted, qs = self._draft_reading_each(feed, k, sampling, generator)
            chain = drafted
        else:  # read on the host with the verdict (observe), not here
            chain, qs = self._draft_on_device(feed, k, sampling, generator)  # [k] on the device
            self._ids, self._unread = list(host), chain  # the cache holds tokens + chain[:-1]
            return Draft.chain(chain, q=torch.stack(qs) if qs else None)
        self._ids = host + drafted[:-1]  # the cache now holds tokens + drafted[:-1]
        return Draft.chain(chain, q=torch.stack(qs) if qs else None)

    def _draw(self, logits: torch.Tensor, sampling: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(index [], q [V] or [K] or None)``: the draft's token index under ``sampling``, on the device."""
        if sampling.greedy:
            return logits.argmax(), None
        q = process_logits(logits, sampling)  # [V] or [K]
        return torch.multinomial(q, 1, generator=generator)[0], q

    def _token(self, idx: torch.Tensor) -> torch.Tensor:  # [] index into the logits -> [] token id
        return idx if self.vocab is None else self.vocab[idx]

    def _full_q(self, q: torch.Tensor) -> torch.Tensor:  # [V] or [K] -> [V]
        return q if self.vocab is None else scatter_rows(q, self.vocab, self.adapter.vocab_size)

    def _draft_on_device(self, feed, k, sampling, generator) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``k`` tokens ``[k]``, each fed back as a device tensor: nothing read on the host."""
        toks, qs = [], []
        for _ in range(k):
            idx, q = self._draw(self._next_logits(feed), sampling, generator)
            tok = self._token(idx)
            toks.append(tok)
            if q is not None:
                qs.append(self._full_q(q))
            feed = tok.reshape(1)
        self.last_confidences = []
        return torch.stack(toks), qs

    def _draft_reading_each(self, feed, k, sampling, generator) -> tuple[list[int], list[torch.Tensor]]:
        """Up to ``k`` tokens, each one's probability read on the host: the confidence stop decides after every
        token, and the tuner records them."""
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        confidences: list[float] = []
        for _ in range(k):
            logits = self._next_logits(feed)  # [V] or [K]
            idx, q = self._draw(logits, sampling, generator)
            prob = (logits.softmax(-1) if q is None else q)[idx]
            if q is not None:
                qs.append(self._full_q(q))
            tok = self._token(idx)
            conf, token = torch.stack([prob.double(), tok.double()]).tolist()  # one read per token (ids < 2**53)
            confidences.append(conf)
            drafted.append(int(token))
            if conf < self.confidence_threshold:
                break
            feed = tok.reshape(1)
        self.last_confidences = confidences
        return drafted, qs

    def observe(self, feedback: StepFeedback) -> None:
        if self._unread is not None:  # the chain's tokens, as the verdict read them (else read here)
            drafted = feedback.draft_tokens
            if drafted is None or len(drafted) != self._unread.numel():
                drafted = self._unread.tolist()
            self._ids += drafted[:-1]
            self._unread = None
        self._committed.extend(feedback.committed)
        self.stats["committed"] += len(feedback.committed)
        if self._inside is not None and feedback.committed:
            committed = feedback.committed_ids
            if committed is None:
                committed = torch.tensor(feedback.committed, dtype=torch.long, device=self._inside.device)
            outside = (~self._inside[committed.to(self._inside.device)]).sum()  # [] kept on the device until reported
            self._outside = outside if self._outside is None else self._outside + outside
        self.policy.observe(feedback.num_proposed, feedback.num_accepted, feedback.draft_seconds, feedback.target_seconds)
