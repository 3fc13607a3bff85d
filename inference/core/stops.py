"""Where a decoding step's committed tokens end: at the first EOS or the token budget (:func:`truncate`), or where a
stop string appears in the decoded text (:func:`find_stop`, over a bounded window: :func:`stop_lookback`)."""

from __future__ import annotations

from collections.abc import Sequence


def truncate(
    new_tokens: list[int],
    produced: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
) -> tuple[list[int], str | None]:
    """Cut a step's committed tokens at the first EOS (kept) and at the token budget."""
    room = max_new_tokens - produced
    for i, tok in enumerate(new_tokens[:room]):
        if tok in eos_token_ids:
            return new_tokens[: i + 1], "eos"
    if len(new_tokens) >= room:
        return new_tokens[:room], "length"
    return new_tokens, None


def stop_lookback(stop_strings: Sequence[str]) -> int:
    """Earlier output tokens a stop-string search decodes before a step's new tokens.

    A stop string that the earlier searches missed ends in the new tokens' text, so it starts at
    most ``bytes(s) - 1`` bytes before them; every token decodes to at least one byte (byte-level
    BPE, SentencePiece with byte fallback), so that many tokens cover it, plus one so the window
    never starts on the stop string's first token (SentencePiece drops a leading space there)."""
    return max((len(s.encode("utf-8")) for s in stop_strings), default=0) + 1


def find_stop(
    tokenizer,
    context: list[int],  # the last stop_lookback(...) tokens of the output before this step
    new_tokens: list[int],  # this step's tokens
    stop_strings: Sequence[str],
) -> int | None:
    """Smallest ``k >= 1`` such that the text of ``context + new_tokens[:k]`` contains a stop
    string, else None. Decodes at most ``len(new_tokens)`` windows of at most
    ``len(context) + len(new_tokens)`` tokens, however long the output already is."""
    if not stop_strings or tokenizer is None or not new_tokens:
        return None

    def hit(k: int) -> bool:
        text = tokenizer.decode(context + new_tokens[:k], skip_special_tokens=True)
        return any(s in text for s in stop_strings)

    if not hit(len(new_tokens)):
        return None
    return next((k for k in range(1, len(new_tokens)) if hit(k)), len(new_tokens))


__all__ = ["find_stop", "stop_lookback", "truncate"]
