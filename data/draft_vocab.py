"""A draft's reduced vocabulary: the target tokens a drafter proposes among, so its LM head has ``K`` rows, not ``V``.

One builder, :func:`draft_vocabulary`, ranks token ids by how often they occur and keeps the top ``K``. Its three
users differ only in what they count and pass:

- the zoo build (:func:`draftsmith.data.zoo.frequent_tokens`): counts over the packed training rows, the special
  tokens added (``config.draft_vocab`` of the zoo's draft);
- EAGLE-3 (:func:`draftsmith.inference.drafters.eagle.draft_vocab`): counts over the answers the head trains on (the
  target's own with ``data_mode=target``, ties broken by the dataset's responses: :func:`ranked_counts`), turned into
  the ``d2t`` / ``t2d`` maps its checkpoints store;
- DistillSpec's ``draft_vocab=answers``: counts over the target's answers, the special tokens always in, and the
  draft's ``current`` vocabulary ranked before answer tokens seen fewer than ``min_count`` times.

:func:`answer_token_counts` counts a tokenized dataset's answer tokens; :func:`draft_vocab_coverage` says how much of
a dataset's answers a vocabulary covers; :func:`ranked_counts` merges two counts into one ranking.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def draft_vocabulary(counts: torch.Tensor, size: int, always: Sequence[int] = (), current: torch.Tensor | None = None,
                     min_count: int = 1) -> torch.Tensor:  # [V] -> [K] int64, ascending
    """The ``size`` token ids a draft proposes among, ascending, from token ``counts`` ``[V]``.

    Ranking: the ids of ``always`` (special tokens; out-of-range ones dropped) first; then the ids counted at least
    ``min_count`` times, most frequent first; then the ids of the ``current`` vocabulary ``[K0]`` (rarer counts
    first); then every other id by count. Ties go to the smaller id. The result holds ``max(size, len(always))``
    ids (at most ``V``; repeated ``always`` ids count once). Without ``current``, ``min_count`` changes nothing: the ``size`` most frequent ids.

    Rarely seen tokens are a noisy sample: with ``current`` (a vocabulary fitted on more text) and ``min_count`` 2,
    a token seen once in the new counts does not displace one of the current vocabulary."""
    counts = counts.detach().cpu().long()  # [V]
    v = counts.numel()
    inside = torch.zeros(v, dtype=torch.bool)  # [V] in the current vocabulary
    if current is not None:
        inside[current.detach().cpu().long()] = True
    frequent = counts >= int(min_count)  # [V]
    # sort keys, most significant first; stable sorts from the least significant one keep ties in id order
    keys = ((~frequent).long(), torch.where(frequent, -counts, torch.zeros_like(counts)), (~inside).long(), -counts)
    order = torch.arange(v)  # [V]
    for key in reversed(keys):
        order = order[torch.sort(key[order], stable=True).indices]
    first = list(dict.fromkeys(int(t) for t in always if 0 <= int(t) < v))
    keep = list(dict.fromkeys([*first, *order.tolist()]))[: max(int(size), len(first))]
    return torch.tensor(sorted(keep), dtype=torch.long)


def answer_token_counts(dataset, vocab_size: int) -> torch.Tensor:  # [V] long
    """How often each target token is a labelled (answer) token of the tokenized ``dataset`` (rows with ``labels``,
    else ``input_ids``; ids outside ``[0, vocab_size)`` and -100 are not counted)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in dataset if dataset is not None else ():
        labels = torch.as_tensor(row.get("labels", row["input_ids"]), dtype=torch.long)
        labels = labels[(labels >= 0) & (labels < vocab_size)]
        counts += torch.bincount(labels, minlength=vocab_size)
    return counts


def ranked_counts(primary: torch.Tensor, secondary: torch.Tensor) -> torch.Tensor:  # [V], [V] -> [V] long
    """One count vector that ranks token ids as ``(primary, secondary)`` does, lexicographically: the ``primary``
    counts decide, the ``secondary`` ones only order ids of equal primary count (``primary * (max secondary + 1) +
    secondary``). Both must be non-negative."""
    primary, secondary = primary.detach().cpu().long(), secondary.detach().cpu().long()
    if bool((primary < 0).any()) or bool((secondary < 0).any()):
        raise ValueError("ranked_counts takes token counts: every entry must be >= 0")
    return primary * (int(secondary.max()) + 1 if secondary.numel() else 1) + secondary


def draft_vocab_coverage(dataset, t2d: torch.Tensor) -> float:  # t2d [V] bool
    """The share of ``dataset``'s answer tokens inside the draft vocabulary ``t2d`` (which target ids are in): on
    held-out answers, the most of a target's tokens a draft with that vocabulary could ever propose."""
    counts = answer_token_counts(dataset, int(t2d.numel()))
    return float(counts[t2d.to(counts.device)].sum()) / max(1, int(counts.sum()))


__all__ = ["answer_token_counts", "draft_vocab_coverage", "draft_vocabulary", "ranked_counts"]
