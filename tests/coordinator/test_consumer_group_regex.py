"""KIP-848's SubscribedTopicRegex is compiled and matched in linear time (RE2, as Kafka's
RE2/J): a pattern built to backtrack costs about what a plain one costs (defect 9)."""

from __future__ import annotations

import time

import pytest

from oncelog.coordinator.group.consumer_group import (
    ConsumerGroup,
    Refusal,
    compile_regex,
    resolve_regexes,
)

# 20 'a's: Python's backtracking re takes about 40 ms on "(a+)+b" (x4 per 2 more).
IMAGE = {"a" * 20: (None, 1), "orders": (None, 1)}


def cost(regex: str, rounds: int = 50) -> float:
    """Seconds to resolve ``regex`` against the image, each round from a fresh group."""
    best = float("inf")
    for _ in range(3):
        start = time.thread_time()
        for _ in range(rounds):
            compile_regex(regex)
            resolve_regexes(ConsumerGroup("g"), {regex}, IMAGE, 0)
        best = min(best, time.thread_time() - start)
    return best


def test_a_backtracking_regex_costs_what_a_plain_one_costs():
    evil = cost("(a+)+b")
    plain = cost("a+b")
    assert evil / plain < 10, (evil, plain)


def test_a_regex_re2_refuses_is_invalid_regular_expression():
    for bad in ("(a)\\1", "(?=a)a", "("):
        with pytest.raises(Refusal) as refused:
            compile_regex(bad)
        assert refused.value.error.name == "invalid_regular_expression"
    assert resolve_regexes(ConsumerGroup("g"), {"orders|a+"}, IMAGE, 0)[0] == {
        "orders|a+": frozenset({"orders", "a" * 20})}
