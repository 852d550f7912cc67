"""Text from strangers, made safe to print: control characters escaped, length bounded.

A server's error body, a row id from a published set, a recipe field or a Hub file can hold
terminal escape sequences (``ESC [ 2 J`` clears the screen), carriage returns and newlines (a line
that overwrites or fakes the one eagle3_raw prints next), or bidirectional-override characters
(text displayed in another order than it reads). :func:`printable` escapes all of them, the way
Python's ``repr`` writes them (``\\x1b``, ``\\n``, ``\\u202e``), so what is printed is what was sent.
"""

from __future__ import annotations

import re

_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]"
)
"""C0 (but tab and newline) and C1 controls, DEL, bidirectional marks and overrides, line and
paragraph separators, the zero-width no-break space."""

_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def printable(text: object, *, newlines: bool = False, limit: int | None = None) -> str:
    """``str(text)`` with every control character escaped, cut to ``limit`` characters if given.

    ``newlines=True`` keeps newlines (and tabs) as they are: for eagle3_raw's own multi-line
    messages, whose stranger parts were escaped where they were put in. Everything else that moves
    the cursor, changes colours or reorders text comes out as a visible escape.
    """
    value = str(text)
    if limit is not None and len(value) > limit:
        value = f"{value[:limit]}... ({len(value) - limit:,} more characters)"
    pattern = _CONTROLS if newlines else _ALL_CONTROLS
    return pattern.sub(_escape, value)


_ALL_CONTROLS = re.compile(f"[\t\n{_CONTROLS.pattern[1:-1]}]")


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
