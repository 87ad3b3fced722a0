"""``ssl.principal.mapping.rules``: the principal's name from a client certificate's subject,
as Kafka's SslPrincipalMapper reads and applies the rules.

The rules are a comma-separated list of ``DEFAULT`` (the subject as it is) and
``RULE:pattern/replacement/`` with an optional ``L`` or ``U`` after the last slash (the name
lower- or upper-cased); a ``/`` inside a pattern or replacement is written ``\\/``, empty
entries are ignored. The first rule whose pattern matches the whole subject names the
principal: every match of the pattern in the subject replaced as Java's ``replaceAll`` does
(``$n`` a group, ``\\c`` the character c; a ``$n`` past the pattern's groups is literal, as
Kafka escapes it). No rule matching: no principal, and the connection is refused.

The subject comes from a client's certificate: patterns are compiled by
protocol/client_regex.py (RE2, linear in the subject), never by Python's ``re``. A pattern
RE2 refuses (back-references, look-arounds), a replacement Java would refuse, or a ``$n``
when the pattern has no group at all (Kafka fails each connection it applies to) is an error
in the configuration, found when the broker starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..protocol.client_regex import InvalidClientRegex, compile_client_regex

DEFAULT = "DEFAULT"


@dataclass(frozen=True)
class Rule:
    pattern: object | None  # compiled (RE2); None: DEFAULT
    replacement: tuple[str | int, ...] = ()  # literal text and group numbers, in order
    case: str = ""  # "L", "U" or ""
    text: str = DEFAULT  # as configured, for messages

    def apply(self, subject: str) -> str | None:
        if self.pattern is None:
            return subject
        if self.pattern.fullmatch(subject) is None:
            return None
        out, at = [], 0
        for match in self.pattern.finditer(subject):
            out.append(subject[at:match.start()])
            out += [part if isinstance(part, str) else (match.group(part) or "")
                    for part in self.replacement]
            at = match.end()
        out.append(subject[at:])
        name = "".join(out)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


def parse_rules(text: str) -> tuple[Rule, ...]:
    """The rules of ``text``; ValueError naming the first that is not one."""
    rules: list[Rule] = []
    s = text.strip()
    i = 0
    while i < len(s):
        if s[i] == ",":  # an empty entry
            i = _skip_spaces(s, i + 1)
            continue
        start = i
        if s.startswith(DEFAULT, i):
            rules.append(Rule(None))
            i += len(DEFAULT)
        elif s.startswith("RULE:", i):
            pattern, i = _to_slash(s, i + len("RULE:"), start)
            replacement, i = _to_slash(s, i, start)
            case = s[i] if i < len(s) and s[i] in "LU" else ""
            i += len(case)
            rules.append(_rule(pattern, replacement, case, s[start:i]))
        else:
            raise ValueError(f"Invalid rule: {s[start:].split(',')[0]!r}")
        i = _skip_spaces(s, i)
        if i < len(s) and s[i] != ",":
            raise ValueError(f"Invalid rule: {s[start:].split(',')[0]!r}, unmatched "
                             f"substring: {s[i:].split(',')[0]!r}")
        i = _skip_spaces(s, i + 1) if i < len(s) else i
    return tuple(rules)


def principal_name(rules: Sequence[Rule], subject: str) -> str | None:
    """The first rule's name for ``subject``; None when no rule applies."""
    for rule in rules:
        name = rule.apply(subject)
        if name is not None:
            return name
    return None


def _skip_spaces(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    return i


def _to_slash(s: str, i: int, start: int) -> tuple[str, int]:
    """The text up to the next unescaped ``/`` (kept as written) and the index after it."""
    j = i
    while j < len(s):
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == "/":
            return s[i:j], j + 1
        j += 1
    raise ValueError(f"Invalid rule: {s[start:]!r}: RULE:pattern/replacement/ expected")


def _rule(pattern: str, replacement: str, case: str, text: str) -> Rule:
    try:
        compiled = compile_client_regex(pattern)
    except InvalidClientRegex as exc:
        raise ValueError(f"{text}: the pattern is not one RE2 accepts: {exc}") from None
    return Rule(compiled, _replacement(replacement, compiled.groups, text), case, text)


def _replacement(text: str, groups: int, rule: str) -> tuple[str | int, ...]:
    """Java's Matcher.appendReplacement syntax, after Kafka's escaping of back-references
    past the pattern's groups."""
    parts: list[str | int] = []
    literal: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 == len(text):
                raise ValueError(f"{rule}: character to be escaped is missing")
            literal.append(text[i + 1])
            i += 2
            continue
        if c != "$":
            literal.append(c)
            i += 1
            continue
        digits = _digits(text, i + 1)
        if not digits:
            raise ValueError(f"{rule}: illegal group reference (a $ not followed by a group "
                             f"number; write \\$ for a dollar)")
        if groups and not digits.startswith("0") and _kafka_escaped(int(digits), groups):
            literal.append("$")  # Kafka makes it literal text, digits and all
            i += 1
            continue
        ref = int(digits[0])
        if ref > groups:
            raise ValueError(f"{rule}: no group {ref} in the pattern")
        used = 1
        for d in digits[1:]:  # Java takes more digits while they still name a group
            if ref * 10 + int(d) > groups:
                break
            ref, used = ref * 10 + int(d), used + 1
        if literal:
            parts.append("".join(literal))
            literal = []
        parts.append(ref)
        i += 1 + used
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _digits(text: str, i: int) -> str:
    j = i
    while j < len(text) and text[j].isdigit() and text[j].isascii():
        j += 1
    return text[i:j]


def _kafka_escaped(index: int, groups: int) -> bool:
    while index > groups and index >= 10:
        index //= 10
    return index > groups
