"""When a stream sends a chunk (``shared/sglang-protocol.md`` §4 "Chunk cadence"), as SGLang 0.5.23's
scheduler decides it (``OutputStreamer.accept``, ``srt/managers/scheduler_components/output_streamer.py``
lines 455-473): with ``stream_interval`` 1 after every token; otherwise after the first token, then
whenever at least ``stream_interval`` tokens are unsent (one token a step: lengths 1, 1+i, 1+2i, ...).

A chunk that is due is held back while the end of the output's decoded tail could be the start of a
stop string (``Req.check_match_stop_str_prefix``, ``srt/managers/schedule_batch.py:1830``); the next
token then finds it due again. The final chunk is always sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eagle3_raw.sglang.protocol.sampling import Sampling

Held = Callable[[int], bool]
"""``held(k)``: the chunk due when the output has ``k`` ids is held back."""


def never_held(k: int) -> bool:
    return False


def chunk_lengths(length: int, interval: int, held: Held = never_held) -> list[int]:
    """Output lengths ``k < length`` after which a stream sends a chunk (the final one not included)."""
    lengths: list[int] = []
    sent = 0
    for k in range(1, length):
        if (interval == 1 or sent == 0 or k - sent >= interval) and not held(k):
            lengths.append(k)
            sent = k
    return lengths


def stop_prefix_hold(
    ids: Sequence[int],
    sampling: Sampling,
    stop_tokens: Callable[[str], int],
    decode: Callable[[Sequence[int]], str],
) -> Held:
    """SGLang's hold-back for a generation whose whole output is ``ids``.

    ``stop_tokens(s)``: how many ids stop string ``s`` encodes to (no special tokens); ``decode``:
    the scheduler's decode (special tokens kept). The tail SGLang decodes is the last
    ``longest stop string + 1`` ids, widened to the longest match of a stop regex; that bound is
    unlimited for any pattern with ``*``, ``+`` or ``{n,}``, and this takes the whole output for every
    stop regex (wider than SGLang for a bounded pattern, which can only hold back more often).
    """
    stops = [s for s in sampling.stop if s]
    if not stops:
        return never_held
    window = len(ids) if sampling.stop_regex else 1 + max(stop_tokens(s) for s in sampling.stop)

    def held(k: int) -> bool:
        tail = decode(ids[max(0, k - window) : k])
        return bool(tail) and any(s in tail or _ends_with_a_prefix(tail, s) for s in stops)

    return held


def _ends_with_a_prefix(text: str, stop: str) -> bool:
    return any(text.endswith(stop[:i]) for i in range(1, min(len(text), len(stop)) + 1))
