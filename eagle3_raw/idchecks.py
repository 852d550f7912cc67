"""Checks of generated ids that hold for every engine: int64s (never booleans), inside the
vocabulary, and no id the server stops at before the last position."""

from __future__ import annotations

from array import array
from typing import Any

import numpy
import numpy.typing

from eagle3_raw.errors import InvalidResponse


def check_ids(
    output_ids: list[Any], vocab_size: int, url: str, *, maybe_bools: bool = True
) -> numpy.typing.NDArray[numpy.int64]:
    """The ids as an int64 array, once they are all ints inside the vocabulary."""
    if maybe_bools and bool in set(map(type, output_ids)):  # array("q") takes True for 1
        raise InvalidResponse(f"{url} returned a boolean among the output ids", url=url)
    try:
        ids = array("q", output_ids)  # in C: refuses floats, strings and nulls
    except (TypeError, OverflowError) as exc:
        raise InvalidResponse(f"{url} returned a token id that is not an int64 ({exc})", url=url) from exc
    values = numpy.frombuffer(ids, dtype=numpy.int64)  # min/max in C too, no Python int per id
    if len(values) and (values.min() < 0 or values.max() >= vocab_size):
        token = next(t for t in ids if not 0 <= t < vocab_size)
        raise InvalidResponse(
            f"{url} returned token id {token} outside the vocabulary (0..{vocab_size - 1})", url=url
        )
    return values


def check_no_early_stop(
    ids: numpy.typing.NDArray[numpy.int64], stops: frozenset[int] | set[int], url: str
) -> None:
    """InvalidResponse when one of ``stops`` (the ids the server stops at) comes before the last
    position: the server stops at the first, unless ``ignore_eos`` was sent (then no caller checks)."""
    if not stops or len(ids) < 2:
        return
    early = numpy.isin(ids[:-1], numpy.fromiter(stops, numpy.int64, len(stops)))
    if early.any():
        position = int(early.argmax())
        raise InvalidResponse(
            f"{url} returned stop token id {int(ids[position])} at output position {position} of "
            f"{len(ids)}: the server stops at the first one of its EOS set unless ignore_eos is sent, so "
            "ids after it are a bad response",
            url=url,
        )
