"""What a client can make a real broker write to its log (issue 28 #10, issue 21): client
strings are cut (log_limits.log_safe), and lines a client provokes again and again are
rate-limited per site (log_limits.RateLimitedLog) with a summary of what was left out."""

from __future__ import annotations

import socket
import struct

from oncelog.broker.log_limits import RateLimitedLog, log_safe
from oncelog.client.network.connection import connect
from oncelog.protocol.api_versions import METADATA

LONG = 1_000_000


def _metadata(conn, names: list[str]):
    def make(mod, version):
        return mod.MetadataRequest(
            topics=tuple(mod.MetadataRequestTopic(name=n, topic_id=None) for n in names)
            if version >= 10 else tuple(mod.MetadataRequestTopic(name=n) for n in names),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    return conn.call(METADATA, make)


def test_long_client_strings_are_cut_in_the_log(broker):
    before = len(broker.log_text())
    with connect(broker.bootstrap, timeout=30) as conn:
        names = [("x" * LONG) + str(i) for i in range(3)] + ["bad name " + "y" * LONG]
        answer = _metadata(conn, names)
    assert all(t.error_code.value == 17 for t in answer.topics)  # INVALID_TOPIC_EXCEPTION
    grown = len(broker.log_text()) - before
    assert grown < 10_000, f"the log grew by {grown} bytes for 4 long names"
    assert "[1,000,001 chars]" in broker.log_text()


def test_metadata_for_invalid_names_is_rate_limited(broker):
    with connect(broker.bootstrap, timeout=30) as conn:
        for i in range(300):
            _metadata(conn, [f"bad name {i}"])
    lines = [line for line in broker.log_text().splitlines()
             if "metadata request for invalid topic" in line]
    assert 1 <= len(lines) <= 10, len(lines)


def test_refused_connections_are_rate_limited(broker):
    # Metadata v99: an unsupported version closes the connection with a WARNING each time.
    frame = struct.pack(">hhih", METADATA, 99, 7, -1)
    for _ in range(200):
        with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(frame)) + frame)
            assert sock.recv(100) == b""  # closed
    lines = [line for line in broker.log_text().splitlines()
             if "closing the connection" in line]
    assert 1 <= len(lines) <= 10, len(lines)


def test_rate_limited_log_sums_up_what_it_left_out(caplog):
    now = [0.0]
    import logging
    limited = RateLimitedLog(logging.getLogger("t"), interval_s=60, burst=3,
                             clock=lambda: now[0])
    with caplog.at_level(logging.INFO, "t"):
        for i in range(10):
            limited.log(logging.WARNING, "refused", "refused %d", i)
        limited.flush()
        assert [r.getMessage() for r in caplog.records] == ["refused 0", "refused 1",
                                                              "refused 2"]
        now[0] = 61
        limited.flush()
        assert "7 more 'refused' lines left out" in caplog.records[-1].getMessage()
        limited.log(logging.WARNING, "refused", "refused again")
        assert caplog.records[-1].getMessage() == "refused again"


def test_log_safe():
    assert log_safe("abc") == "abc"
    cut = log_safe("z" * 5000)
    assert cut.startswith("z" * 200) and cut.endswith("[5,000 chars]") and len(cut) < 230


def test_every_logged_argument_is_bounded(broker):
    """The safety net behind log_safe: a site that logs a client string whole (the
    transaction coordinator logging a transactional id) still writes at most
    LOG_ARG_MAX_CHARS of it."""
    import datetime

    from oncelog.broker.log_limits import LOG_ARG_MAX_CHARS
    from oncelog.protocol.api_versions import INIT_PRODUCER_ID

    before = len(broker.log_text())
    with connect(broker.bootstrap, timeout=30) as conn:
        for i in range(3):
            conn.call(INIT_PRODUCER_ID, lambda mod, version, i=i: mod.InitProducerIdRequest(
                transactional_id=f"{i}" + "t" * 30_000,
                transaction_timeout=datetime.timedelta(seconds=60), producer_id=-1,
                producer_epoch=-1))
    grown = len(broker.log_text()) - before
    assert grown < 3 * 4 * (LOG_ARG_MAX_CHARS + 500), grown
