"""The review's random exploration (seal_model.py), kept small as a guard: random histories of
appends, flushes, rolls whose seals run late and in any order (fsync only, or whole, an index
write failing, retried), retention (its directory fsync failing too), DeleteRecords,
truncations, cleans, clean and unclean restarts, with the power cut at each file operation.
Every acknowledged batch not removed by retention or DeleteRecords is kept, nothing is kept
twice, no offset is missing below the log end, no marker is left, and a second power cut and a
clean restart keep the same. About 500 histories of 30-40 steps were explored this way by the
review."""

from __future__ import annotations

import logging

import pytest
from support import seal_model


@pytest.mark.parametrize("seed", range(8))
def test_random_histories_with_seals_in_flight_keep_every_acknowledged_batch(seed, caplog):
    caplog.set_level(logging.CRITICAL)
    gaps: list = []
    failures = seal_model.explore(seed, 30, power_seeds=(1,), gaps=gaps)
    assert not failures, failures[0]
    assert not gaps, gaps[0]  # no record after a hole either (a truncation cut short)
