"""Regular expressions that clients send, matched in time linear in the text.

Kafka reads a client's regex with RE2/J (KIP-848's SubscribedTopicRegex, KIP-1152's
ListTransactions pattern) precisely so that no pattern can make the broker backtrack:
``(a+)+b`` against 28 ``a``s costs Python's ``re`` seconds, RE2 microseconds. Every regex a
client sends goes through ``compile_client_regex``; nothing a client sends reaches ``re``.

RE2 refuses what RE2/J refuses (back-references, look-arounds), so a pattern Kafka rejects is
rejected here too, as INVALID_REGULAR_EXPRESSION by the caller.
"""

from __future__ import annotations

import re2

# Memory RE2 may use to compile one pattern: a pattern past it is refused, not truncated.
_MAX_MEM = 8 << 20
# Longer patterns are refused before RE2 parses them (Kafka's topic names are <= 249 chars;
# a regex over all of them fits in this many times over).
MAX_PATTERN_LENGTH = 64 * 1024

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a client's bad regex is answered, not written to stderr
_OPTIONS.max_mem = _MAX_MEM


class InvalidClientRegex(ValueError):
    """The pattern is not one RE2 accepts; the message says why."""


def compile_client_regex(pattern: str):
    """A compiled pattern with ``fullmatch(text)``, as RE2/J's ``matcher(text).matches()``."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise InvalidClientRegex(f"longer than {MAX_PATTERN_LENGTH} characters")
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        text = exc.args[0] if exc.args else exc
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        raise InvalidClientRegex(str(text)) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidClientRegex(str(exc)) from None
