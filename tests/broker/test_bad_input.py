"""Hostile and broken input over raw sockets: the broker answers with the right Kafka error
code (or closes that one connection), says why in its log, and keeps serving everyone else.
"""

from __future__ import annotations

import datetime
import random
import socket
import struct
import time

import crc32c
import pytest
from kio.schema.create_topics.v7.request import (
    CreatableTopic,
    CreatableTopicConfig,
    CreateTopicsRequest,
)
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from support.brokers import batches_on_disk
from support.crafted import batch_of, record, with_payload
from support.raw_wire import (
    API_VERSIONS,
    CREATE_TOPICS,
    FETCH,
    IO_TIMEOUT,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    VERSIONS,
    api_versions_request,
    call,
    connect,
    read_frame,
)

from oncelog.protocol.api_versions import SUPPORTED_VERSIONS
from oncelog.protocol.messages import decode_response, encode_request
from oncelog.protocol.record_batch import (
    CONTROL_BIT,
    HEADER_SIZE,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    crc_of,
    read_header,
)
from oncelog.protocol.records import CODECS, compress, encode_batch

TOPIC = "bad-input"  # each test's own name (bad-input-<n>), set by the broker fixture below
LATEST = -1


# --- raw socket helpers ---------------------------------------------------------------------


def send_frame(sock: socket.socket, payload: bytes, size: int | None = None) -> None:
    """Send ``payload`` behind a size prefix; ``size`` overrides the honest one."""
    sock.sendall(struct.pack(">i", len(payload) if size is None else size) + payload)


def assert_closed(sock: socket.socket) -> None:
    """The broker closes the connection, with no response bytes before the close."""
    try:
        data = sock.recv(65536)
    except ConnectionResetError:
        data = b""
    except TimeoutError:
        pytest.fail(f"the broker kept the connection open for {IO_TIMEOUT} s")
    assert data == b"", f"expected a closed connection, got {data[:64]!r}"
    sock.close()


# --- request bodies ---------------------------------------------------------------------------


def metadata_request(*names: str, auto_create: bool = False) -> MetadataRequest:
    topics = tuple(MetadataRequestTopic(topic_id=None, name=n) for n in names) if names else None
    return MetadataRequest(topics=topics, allow_auto_topic_creation=auto_create,
                           include_topic_authorized_operations=False)


def create_topics_request(*names: str, partitions: int = 1,
                          configs: dict[str, str] | None = None) -> CreateTopicsRequest:
    settings = tuple(CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items())
    return CreateTopicsRequest(
        topics=tuple(CreatableTopic(name=n, num_partitions=partitions, replication_factor=1,
                                    assignments=(), configs=settings) for n in names),
        timeout=datetime.timedelta(seconds=5), validate_only=False)


def produce_request(parts: dict[tuple[str, int], bytes | None], acks: int = -1) -> ProduceRequest:
    topics: dict[str, list[PartitionProduceData]] = {}
    for (topic, index), records in parts.items():
        topics.setdefault(topic, []).append(PartitionProduceData(index=index, records=records))
    return ProduceRequest(acks=acks, timeout=datetime.timedelta(seconds=5), topic_data=tuple(
        TopicProduceData(name=t, partition_data=tuple(p)) for t, p in topics.items()))


def fetch_request(topic: str, index: int, offset: int, max_wait_ms: int = 0,
                  min_bytes: int = 1) -> FetchRequest:
    part = FetchPartition(partition=index, fetch_offset=offset, partition_max_bytes=1 << 20)
    return FetchRequest(max_wait=datetime.timedelta(milliseconds=max_wait_ms),
                        min_bytes=min_bytes, topics=(FetchTopic(topic=topic, partitions=(part,)),),
                        forgotten_topics_data=())


def list_offsets_request(topic: str, index: int) -> ListOffsetsRequest:
    part = ListOffsetsPartition(partition_index=index, timestamp=LATEST)
    return ListOffsetsRequest(replica_id=-1, isolation_level=0,
                              topics=(ListOffsetsTopic(name=topic, partitions=(part,)),))


# --- batches ----------------------------------------------------------------------------------


def batch(n: int = 1, value_size: int = 10) -> bytes:
    return encode_batch([(b"k%d" % i, b"v" * value_size, (), 1_700_000_000_000 + i)
                         for i in range(n)])


def patched(data: bytes, pos: int, fmt: str, value: int, fix_crc: bool = True) -> bytes:
    """``data`` with one header field overwritten; the CRC recomputed unless told not to."""
    buf = bytearray(data)
    struct.pack_into(fmt, buf, pos, value)
    if fix_crc:
        struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


# --- higher-level checks ----------------------------------------------------------------------


def assert_serving(broker) -> None:
    """A fresh connection gets good ApiVersions and Metadata answers."""
    assert broker.alive
    with connect(broker) as sock:
        versions = call(sock, API_VERSIONS, api_versions_request())
        assert versions.error_code == ErrorCode.none
        assert {k.api_key for k in versions.api_keys} == set(SUPPORTED_VERSIONS)
        metadata = call(sock, METADATA, metadata_request())
        assert [b.port for b in metadata.brokers] == [broker.port]


def create_topic(sock, name: str | None = None, partitions: int = 1, **configs: str) -> None:
    """A topic; ``configs`` are topic configs with dots spelled as underscores."""
    name = name or TOPIC
    request = create_topics_request(name, partitions=partitions, configs={
        key.replace("_", "."): value for key, value in configs.items()})
    result = call(sock, CREATE_TOPICS, request)
    assert [t.error_code for t in result.topics] == [ErrorCode.none], result


def produce(sock, parts: dict[tuple[str, int], bytes | None], acks: int = -1) -> dict:
    """{(topic, partition): (error code, base offset)} of one Produce request."""
    response = call(sock, PRODUCE, produce_request(parts, acks))
    return {(t.name, p.index): (p.error_code, p.base_offset)
            for t in response.responses for p in t.partition_responses}


def produce_one(sock, records: bytes | None, topic: str | None = None, index: int = 0,
                acks: int = -1) -> tuple[ErrorCode, int]:
    topic = topic or TOPIC
    return produce(sock, {(topic, index): records}, acks)[(topic, index)]


def produce_answer(sock, records: bytes | None, topic: str | None = None, index: int = 0):
    """The whole partition answer (v9): error, offsets, record errors, error message."""
    topic = topic or TOPIC
    response = call(sock, PRODUCE, produce_request({(topic, index): records}))
    (part,) = response.responses[0].partition_responses
    return part


def latest_offset(sock, topic: str | None = None, index: int = 0) -> int:
    topic = topic or TOPIC
    response = call(sock, LIST_OFFSETS, list_offsets_request(topic, index))
    (part,) = response.topics[0].partitions
    assert part.error_code == ErrorCode.none
    return part.offset


def fetch_one(sock, topic: str, index: int, offset: int):
    response = call(sock, FETCH, fetch_request(topic, index, offset))
    assert response.error_code == ErrorCode.none
    (part,) = response.responses[0].partitions
    return part


def assert_logged(broker, *fragments: str) -> None:
    text = broker.log_text()
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the broker log:\n{text}"


def header_prefix(api_key: int, version: int, correlation_id: int = 1) -> bytes:
    """Request header v1 (key, version, correlation id, client id "t")."""
    return struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t"


# --- connection-level errors: the broker closes the connection -------------------------------


def _valid_produce_payload() -> bytes:
    frame = encode_request(PRODUCE, 9, 1, "t", produce_request({(TOPIC, 0): batch(3)}))
    return frame[4:]


MALFORMED = {
    # A Metadata v12 header followed by bytes that are no Metadata body: 0xff... is a varint
    # that never ends.
    "garbage body": (lambda: header_prefix(METADATA, 12) + b"\x00" + b"\xff" * 40,
                     None, "malformed api key 3 v12"),
    "random bytes after a produce header": (
        lambda: header_prefix(PRODUCE, 9)[:8] + random.Random(7).randbytes(200),
        None, "malformed api key 0 v9"),
    "truncated request body": (lambda: _valid_produce_payload()[:-20], None,
                               "malformed api key 0 v9"),
    "header only": (lambda: struct.pack(">hhi", METADATA, 12, 1), None, "malformed api key 3"),
    "negative frame size": (lambda: b"\0" * 16, -1, "frame size -1 is outside"),
    "frame size 0": (lambda: b"", 0, "frame size 0 is outside"),
    "frame size below 8": (lambda: b"\0\x12\0\0\0\0\0", 7, "frame size 7 is outside"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_frame_closes_only_that_connection(broker, case):
    make, size, fragment = MALFORMED[case]
    with connect(broker) as bystander:  # opened before: must survive the bad peer
        create_topic(bystander)
        with connect(broker) as sock:
            send_frame(sock, make(), size)
            assert_closed(sock)
        assert_logged(broker, fragment, "closing the connection")
        assert produce_one(bystander, batch(2)) == (ErrorCode.none, 0)
    assert_serving(broker)


@pytest.mark.parametrize("api_key,version,fragment", [
    (9999, 0, "api key 9999 version 0 is not supported"),
    (-1, 0, "api key -1 version 0 is not supported"),
    (PRODUCE, 1, "api key 0 version 1 is not supported"),
    (FETCH, 99, "api key 1 version 99 is not supported"),
    (METADATA, -1, "api key 3 version -1 is not supported"),
])
def test_unknown_api_or_version_closes_the_connection(broker, api_key, version, fragment):
    with connect(broker) as sock:
        # A correct request before it is answered; the bad one ends the connection.
        assert call(sock, API_VERSIONS, api_versions_request()).error_code == ErrorCode.none
        send_frame(sock, header_prefix(api_key, version) + b"\0" * 32)
        assert_closed(sock)
    assert_logged(broker, fragment)
    assert_serving(broker)


def test_too_new_api_versions_gets_v0_answer_with_unsupported_version(broker):
    with connect(broker) as sock:
        # A v99 body is unknown to us; only the header prefix can be trusted (KIP-511).
        send_frame(sock, header_prefix(API_VERSIONS, 99, correlation_id=4242) + b"\x05future")
        correlation_id, body = decode_response(API_VERSIONS, 0, read_frame(sock))
        assert correlation_id == 4242
        assert body.error_code == ErrorCode.unsupported_version
        listed = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
        assert {key: hi for key, (_, hi) in listed.items()} \
            == {key: hi for key, (_, hi) in SUPPORTED_VERSIONS.items()}
        # The client now retries at a version we support, on the same connection, and is
        # told the same table.
        retry = call(sock, API_VERSIONS, api_versions_request())
        assert retry.error_code == ErrorCode.none
        assert {k.api_key: (k.min_version, k.max_version) for k in retry.api_keys} == listed
    assert_logged(broker, "ApiVersions v99 is newer than ours")
    assert_serving(broker)


def test_oversized_frame_is_refused_from_its_size_prefix(start_broker):
    broker = start_broker(**{"socket.request.max.bytes": "100000"})
    for size in (100_001, 2**31 - 1):
        with connect(broker) as sock:
            # Only the prefix is sent: a close proves the broker neither waited for the body
            # nor needed it.
            sock.sendall(struct.pack(">i", size))
            assert_closed(sock)
        assert_logged(broker, f"frame size {size} is outside 8..100000")
    # A frame of exactly the limit is fine (trailing bytes after a body are tolerated).
    with connect(broker) as sock:
        frame = encode_request(METADATA, 12, 9, "t", metadata_request())[4:]
        send_frame(sock, frame + b"\0" * (100_000 - len(frame)))
        correlation_id, body = decode_response(METADATA, 12, read_frame(sock))
        assert correlation_id == 9 and body.brokers[0].port == broker.port
    assert_serving(broker)


# --- in-band errors: a per-partition error code, the connection stays usable ----------------


def test_bad_crc_is_corrupt_message_and_appends_nothing(broker):
    with connect(broker) as sock:
        create_topic(sock)
        assert produce_one(sock, batch(2)) == (ErrorCode.none, 0)
        good = batch(3)
        flipped = good[:-1] + bytes([good[-1] ^ 0x01])
        assert produce_one(sock, flipped)[0] == ErrorCode.corrupt_message
        wrong_crc = patched(good, 17, ">I", 0xDEADBEEF, fix_crc=False)
        assert produce_one(sock, wrong_crc)[0] == ErrorCode.corrupt_message
        assert latest_offset(sock) == 2
        assert produce_one(sock, good) == (ErrorCode.none, 2)
        assert latest_offset(sock) == 5
    assert_logged(broker, "CRC32C does not match", "(corrupt_message)")
    assert_serving(broker)


def assert_refused(broker, error: ErrorCode, cases: list[tuple[bytes | None, str]]) -> None:
    """Each bad record set gets ``error`` and appends nothing, says why in the log, and
    leaves both its own connection and fresh ones working."""
    with connect(broker) as sock:
        create_topic(sock)
        for n, (records, fragment) in enumerate(cases):
            assert produce_one(sock, records)[0] == error, fragment
            assert latest_offset(sock) == n, fragment
            assert produce_one(sock, batch(1)) == (ErrorCode.none, n), fragment
            assert_logged(broker, fragment, f"({error.name})")
            assert_serving(broker)


def test_torn_record_sets_are_corrupt_message(broker):
    assert_refused(broker, ErrorCode.corrupt_message, [
        (b"", "empty record set"),
        (None, "null record set"),
        (b"\0" * 10, "truncated batch header"),
        (b"\0" * 20, "batch length 0 is out of range"),  # zeros are corruption, not magic 0
        (batch(1)[:-3], f"batch length {len(batch(1)) - 12} is out of range"),  # torn
        (patched(batch(1), 8, ">i", 10), "batch length 10 is out of range"),
        (patched(batch(1), 8, ">i", 40), "batch length 40 is out of range"),  # < a v2 header
        (patched(batch(1), 8, ">i", -100), "batch length -100 is out of range"),
    ])


def test_batch_over_message_max_bytes_is_message_too_large(start_broker):
    broker = start_broker(**{"message.max.bytes": "2000"})
    with connect(broker) as sock:
        create_topic(sock)
        assert produce_one(sock, batch(1, value_size=3000))[0] == ErrorCode.message_too_large
        assert latest_offset(sock) == 0
        assert produce_one(sock, batch(1, value_size=1900)) == (ErrorCode.none, 0)
    assert_logged(broker, "exceeds the limit of 2000 bytes", "(message_too_large)")
    assert_serving(broker)


def test_old_or_unknown_magic_is_unsupported_for_message_format(broker):
    assert_refused(broker, ErrorCode.unsupported_for_message_format, [
        (patched(batch(2), 16, ">b", magic), f"message format v{magic} is not supported")
        for magic in (0, 1, 3)
    ])


def test_count_and_last_offset_delta_disagreeing_is_invalid_record(broker):
    assert_refused(broker, ErrorCode.invalid_record, [
        (patched(batch(3), 57, ">i", 5), "says 5 records but last offset delta 2"),
        (patched(batch(3), 57, ">i", 0), "says 0 records but last offset delta 2"),
        (patched(batch(3), 23, ">i", 7), "says 3 records but last offset delta 7"),
        (patched(batch(3), 23, ">i", -1), "says 3 records but last offset delta -1"),
    ])


def test_unknown_topic_or_partition(broker):
    with connect(broker) as sock:
        create_topic(sock, partitions=2)
        assert produce_one(sock, batch(1), topic="missing")[0] \
            == ErrorCode.unknown_topic_or_partition
        assert produce_one(sock, batch(1), index=99)[0] == ErrorCode.unknown_topic_or_partition
        assert produce_one(sock, batch(1), index=-1)[0] == ErrorCode.unknown_topic_or_partition
        assert fetch_one(sock, "missing", 0, 0).error_code == ErrorCode.unknown_topic_or_partition
        assert fetch_one(sock, TOPIC, 99, 0).error_code == ErrorCode.unknown_topic_or_partition
        # Produce never creates topics; the same connection still works.
        metadata = call(sock, METADATA, metadata_request("missing"))
        assert metadata.topics[0].error_code == ErrorCode.unknown_topic_or_partition
        assert produce_one(sock, batch(1), index=1) == (ErrorCode.none, 0)
    assert_logged(broker, "missing-0 does not exist", f"{TOPIC}-99 does not exist")
    assert_serving(broker)


BAD_NAMES = ["bad/name", "..", ".", "x" * 300, "", "space name", "ünïcode"]


def test_invalid_topic_names_in_create_topics(start_broker):
    broker = start_broker()  # its own: it holds the whole list of topics and directories
    with connect(broker) as sock:
        result = call(sock, CREATE_TOPICS, create_topics_request(*BAD_NAMES, "good-name"))
        errors = {t.name: t.error_code for t in result.topics}
        assert errors == {**{n: ErrorCode.invalid_topic_exception for n in BAD_NAMES},
                          "good-name": ErrorCode.none}
        metadata = call(sock, METADATA, metadata_request())
        assert [t.name for t in metadata.topics] == ["good-name"]
    assert_logged(broker, "create topic 'bad/name' refused", "create topic '..' refused",
                  "longer than 249 characters")
    assert not (broker.data_dir / "bad").exists()
    assert {p.name for p in broker.data_dir.iterdir() if not p.name.startswith(".")} \
        <= {"good-name-0"}  # partition directories appear on first use
    assert_serving(broker)


def test_invalid_topic_names_in_metadata_are_not_auto_created(broker):
    with connect(broker) as sock:
        metadata = call(sock, METADATA, metadata_request(*BAD_NAMES, "auto", auto_create=True))
        errors = {t.name: t.error_code for t in metadata.topics}
        assert errors == {**{n: ErrorCode.invalid_topic_exception for n in BAD_NAMES},
                          "auto": ErrorCode.none}
        assert len(metadata.topics) == len(BAD_NAMES) + 1
        assert produce_one(sock, batch(1), topic="auto") == (ErrorCode.none, 0)
    assert_logged(broker, "metadata request for invalid topic 'bad/name' refused")
    assert_serving(broker)


def test_invalid_acks(broker):
    with connect(broker) as sock:
        create_topic(sock)
        for acks in (5, 2, -2):
            assert produce_one(sock, batch(1), acks=acks)[0] == ErrorCode.invalid_required_acks
            assert_logged(broker, f"acks must be -1, 0 or 1, not {acks}")
        assert latest_offset(sock) == 0
        assert produce_one(sock, batch(1), acks=1) == (ErrorCode.none, 0)
    assert_serving(broker)


def test_fetch_outside_the_log_is_offset_out_of_range(broker):
    with connect(broker) as sock:
        create_topic(sock)
        assert produce_one(sock, batch(3)) == (ErrorCode.none, 0)
        for offset in (4, 1_000_000, -5):
            part = fetch_one(sock, TOPIC, 0, offset)
            assert part.error_code == ErrorCode.offset_out_of_range
            assert part.high_watermark == 3 and part.log_start_offset == 0
        # At the end is not out of range, just empty.
        part = fetch_one(sock, TOPIC, 0, 3)
        assert (part.error_code, part.records) == (ErrorCode.none, b"")
        part = fetch_one(sock, TOPIC, 0, 0)
        assert part.error_code == ErrorCode.none and len(part.records) > 0
    assert_logged(broker, f"fetch from {TOPIC}-0 at offset 1000000")
    assert_serving(broker)


def test_partitions_in_one_produce_request_are_judged_independently(broker):
    with connect(broker) as sock:
        create_topic(sock, partitions=3)
        good = batch(2)
        results = produce(sock, {
            (TOPIC, 0): good,
            (TOPIC, 1): good[:-1] + bytes([good[-1] ^ 0xFF]),
            (TOPIC, 2): patched(good, 16, ">b", 1),
            (TOPIC, 99): good,
            ("missing", 0): good,
        })
        assert results == {
            (TOPIC, 0): (ErrorCode.none, 0),
            (TOPIC, 1): (ErrorCode.corrupt_message, -1),
            (TOPIC, 2): (ErrorCode.unsupported_for_message_format, -1),
            (TOPIC, 99): (ErrorCode.unknown_topic_or_partition, -1),
            ("missing", 0): (ErrorCode.unknown_topic_or_partition, -1),
        }
        assert [latest_offset(sock, TOPIC, i) for i in range(3)] == [2, 0, 0]
        assert produce_one(sock, good, index=1) == (ErrorCode.none, 0)
    assert_serving(broker)


# --- pipelining -------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [20, 150])
def test_pipelined_requests_are_answered_in_order(broker, count):
    with connect(broker) as setup:
        create_topic(setup)
    kinds = [
        (API_VERSIONS, api_versions_request()),
        (METADATA, metadata_request(TOPIC)),
        (PRODUCE, produce_request({(TOPIC, 0): batch(1)})),
        (FETCH, fetch_request(TOPIC, 0, 0)),
        (LIST_OFFSETS, list_offsets_request(TOPIC, 0)),
    ]
    plan = [kinds[i % len(kinds)] for i in range(count)]
    # Long-polls until its 100 ms run out: the requests behind it must wait for it.
    plan[6] = (FETCH, fetch_request(TOPIC, 0, 0, max_wait_ms=100, min_bytes=1 << 20))
    ids = [1000 + 37 * i for i in range(count)]
    with connect(broker) as sock:
        data = b"".join(encode_request(key, VERSIONS[key], cid, "pipe", body)
                        for cid, (key, body) in zip(ids, plan, strict=True))
        sock.sendall(data)
        produced = 0
        for cid, (key, _) in zip(ids, plan, strict=True):
            got, body = decode_response(key, VERSIONS[key], read_frame(sock))
            assert got == cid
            if key == PRODUCE:
                assert body.responses[0].partition_responses[0].base_offset == produced
                produced += 1
            if key == LIST_OFFSETS:
                assert body.topics[0].partitions[0].offset == produced
    assert_serving(broker)


def test_frames_split_anywhere_are_reassembled(broker):
    frame = encode_request(API_VERSIONS, 3, 77, "t", api_versions_request())
    with connect(broker) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(frame)):
            sock.sendall(frame[i:i + 1])
        correlation_id, body = decode_response(API_VERSIONS, 3, read_frame(sock))
        assert (correlation_id, body.error_code) == (77, ErrorCode.none)
    # A peer that vanishes mid-frame costs nothing but its buffer.
    with connect(broker) as sock:
        sock.sendall(frame[:len(frame) // 2])
    assert_serving(broker)


def test_large_frames_split_anywhere_are_reassembled(broker):
    """Frames over 64 KiB are received into a buffer of their own; pieces that end anywhere
    (inside the prefix, at the frame's end, with the next frame's first bytes) change nothing."""
    with connect(broker) as setup:
        create_topic(setup)
    big = batch(200, value_size=1000)
    first = encode_request(PRODUCE, 9, 1, "t", produce_request({(TOPIC, 0): big}))
    second = encode_request(LIST_OFFSETS, 7, 2, "t", list_offsets_request(TOPIC, 0))
    third = encode_request(PRODUCE, 9, 3, "t", produce_request({(TOPIC, 0): big}))
    stream = first + second + third
    assert len(first) > 2 * 64 * 1024
    cuts = sorted({1, 2, 3, 5, 70_000, len(first) - 1, len(first), len(first) + 3,
                   len(first) + len(second) + 2, len(stream) - 1})
    with connect(broker) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            sock.sendall(stream[start:end])
            time.sleep(0.01)  # let each piece arrive as a read of its own
        for cid, key in ((1, PRODUCE), (2, LIST_OFFSETS), (3, PRODUCE)):
            got, body = decode_response(key, VERSIONS[key], read_frame(sock))
            assert got == cid
            if key == LIST_OFFSETS:
                assert body.topics[0].partitions[0].offset == 200
            else:
                assert body.responses[0].partition_responses[0].base_offset == 200 * (cid // 3)
        # The broker sets base offset and leader epoch; the rest is the client's bytes.
        for offset in (0, 200):
            assert fetch_one(sock, TOPIC, 0, offset).records[16:len(big)] == big[16:]
    assert_serving(broker)


def test_large_frame_cut_short_by_its_peer_stores_nothing(broker):
    with connect(broker) as sock:
        create_topic(sock)
    payload = encode_request(PRODUCE, 9, 1, "t",
                             produce_request({(TOPIC, 0): batch(200, value_size=1000)}))[4:]
    with connect(broker) as sock:
        # A prefix promising more than is sent, then the peer goes: the broker waits for the
        # rest, then drops the partial frame with the connection.
        send_frame(sock, payload[:100_000], size=len(payload))
    with connect(broker) as sock:
        assert latest_offset(sock) == 0
    assert_serving(broker)


# --- record validation: trust no header --------------------------------------------------------


def now_ms() -> int:
    return int(time.time() * 1000)


def hostile_batches() -> dict[str, tuple[bytes, ErrorCode, str]]:
    """Batches with a right CRC that Kafka refuses: (bytes, error, what the answer says)."""
    now = now_ms()
    one = record(0)
    txn = TRANSACTIONAL_BIT
    cases = {
        "control batch": (batch_of(one, 1, now, attributes=CONTROL_BIT, producer_id=1),
                          ErrorCode.invalid_record, "not allowed to write control records"),
        # Judged as any batch of a producer (the identity first);
        # tests/producer_state/test_txn_storage.py has the transactional refusals.
        "transactional batch of a made-up producer": (
            batch_of(one, 1, now, attributes=txn, producer_id=1),
            ErrorCode.unknown_producer_id, "was never issued by this cluster"),
        "count 3, one record inside": (batch_of(one, 3, now), ErrorCode.invalid_record,
                                       "batch says 3 records but holds 1"),
        "huge count": (batch_of(one, 2**31 - 1, now), ErrorCode.invalid_record,
                       f"batch says {2**31 - 1} records but holds 1"),
        "lying record length": (batch_of(record(0, length=90) + one, 2, now),
                                ErrorCode.invalid_record, "record 0: length 90 runs past"),
        "overlong varint": (batch_of(record(0, body=b"\x00\x00" + b"\xff" * 5 + b"\x00"), 1,
                                     now), ErrorCode.invalid_record, "varint is too long"),
        "offset deltas 0, 0": (batch_of(one + one, 2, now), ErrorCode.invalid_record,
                               "record 1: offset delta 0, expected 1"),
        "LogAppendTime from a client": (batch_of(one, 1, now, attributes=TIMESTAMP_TYPE_BIT),
                                        ErrorCode.invalid_timestamp, "rejected due to invalid "
                                                                     "timestamp"),
    }
    for name, codec in CODECS.items():
        if name != "none":
            garbage = compress(codec, one)[:-3]  # cut short, with a CRC that covers the cut
            header = read_header(batch_of(one, 1, now))._replace(attributes=codec)
            cases[f"{name} garbage"] = (with_payload(header, garbage), ErrorCode.corrupt_message,
                                        f"{name} batch does not decompress")
            cases[f"{name}, count 2, one record inside"] = (
                batch_of(one, 2, now, codec=codec), ErrorCode.invalid_record,
                "batch says 2 records but holds 1")
    return cases


def assert_nothing_stored_but(broker, good: list[bytes], topic: str | None = None) -> None:
    topic = topic or TOPIC
    """The partition's files hold exactly the ``good`` batches, with their own bytes (no
    batch at all: not even a directory)."""
    exists = (broker.data_dir / f"{topic}-0").exists()
    on_disk = batches_on_disk(broker, topic, 0) if good or exists else []
    assert exists == bool(good)
    assert [h.records_count for h in on_disk] == [read_header(b).records_count for b in good]
    assert [h.crc for h in on_disk] == [read_header(b).crc for b in good]


def test_hostile_batches_are_refused_and_leave_no_trace(broker):
    """Each is answered with Kafka's error, a message that says why and the partition's log
    start offset; the partition keeps serving, and its files hold only the good batches."""
    cases = hostile_batches()
    good: list[bytes] = []
    with connect(broker) as sock:
        create_topic(sock)
        for name, (records, error, fragment) in cases.items():
            answer = produce_answer(sock, records)
            assert (answer.error_code, answer.base_offset) == (error, -1), name
            assert fragment in answer.error_message, (name, answer.error_message)
            assert answer.log_start_offset == 0, name  # a known partition's, not -1
            assert_logged(broker, fragment, f"({error.name})")
            good.append(batch(2))
            assert produce_one(sock, good[-1]) == (ErrorCode.none, 2 * (len(good) - 1)), name
        assert latest_offset(sock) == 2 * len(cases)
        for i, sent in enumerate(good):  # read back: the client's bytes but offset and epoch
            assert fetch_one(sock, TOPIC, 0, 2 * i).records[16:len(sent)] == sent[16:]
    assert_nothing_stored_but(broker, good)
    assert_serving(broker)


def test_log_start_offset_of_refusals_and_no_trace_on_an_unused_partition(broker):
    with connect(broker) as sock:
        create_topic(sock)
        answer = produce_answer(sock, batch(1), index=7)
        assert (answer.error_code, answer.log_start_offset) == \
            (ErrorCode.unknown_topic_or_partition, -1)
        answer = produce_answer(sock, batch_of(record(0), 2, now_ms()))
        assert (answer.error_code, answer.log_start_offset) == (ErrorCode.invalid_record, 0)
        # Refused on a partition never written: not even its directory was made.
        assert not (broker.data_dir / f"{TOPIC}-0").exists()


def test_null_keys_on_a_compacted_topic_are_named_per_record(broker):
    keyless = batch_of(record(0) + record(1, key=None) + record(2) + record(3, key=None), 4,
                       now_ms(), codec=CODECS["lz4"])
    with connect(broker) as sock:
        create_topic(sock, cleanup_policy="compact")
        answer = produce_answer(sock, keyless)
        assert answer.error_code == ErrorCode.invalid_record
        message = "Compacted topic cannot accept message without key"
        assert [(e.batch_index, e.batch_index_error_message) for e in answer.record_errors] \
            == [(1, message), (3, message)]
        assert answer.error_message.startswith("One or more records have been rejected")
        keyed = batch(3)
        assert produce_one(sock, keyed) == (ErrorCode.none, 0)
        create_topic(sock, "plain")  # cleanup.policy=delete: keys are optional
        assert produce_one(sock, keyless, topic="plain") == (ErrorCode.none, 0)
    assert_logged(broker, message)
    assert_nothing_stored_but(broker, [keyed])


def test_timestamps_out_of_bounds_are_invalid_timestamp(broker):
    hour = 3_600_000
    now = now_ms()
    # An hour back is allowed, ten seconds ahead is allowed; the rest is not.
    payload = (record(0) + record(1, ts_delta=-2 * hour) + record(2, ts_delta=-hour // 2)
               + record(3, ts_delta=10_000) + record(4, ts_delta=2 * hour))
    with connect(broker) as sock:
        create_topic(sock, message_timestamp_before_max_ms=str(hour))
        answer = produce_answer(sock, batch_of(payload, 5, now))
        assert answer.error_code == ErrorCode.invalid_timestamp
        assert [e.batch_index for e in answer.record_errors] == [1, 4]
        assert all("is out of range" in e.batch_index_error_message
                   for e in answer.record_errors)
        # The broker's default refuses only the future beyond an hour (Kafka 4's defaults).
        create_topic(sock, "defaults")
        answer = produce_answer(sock, batch_of(payload, 5, now), topic="defaults")
        assert [e.batch_index for e in answer.record_errors] == [4]
        assert produce_one(sock, batch_of(payload[:-len(record(4, ts_delta=2 * hour))], 4,
                                          now), topic="defaults") == (ErrorCode.none, 0)
    assert_nothing_stored_but(broker, [])


def test_max_timestamp_is_made_true_on_disk(broker):
    """librdkafka writes max timestamp 0 when its records have none (-1): stored as -1, with
    a CRC that matches the stored bytes; a true header is stored as sent."""
    no_timestamps = batch_of(record(0) + record(1), 2, -1, max_ts=0)
    sent = batch(2)
    with connect(broker) as sock:
        create_topic(sock)
        assert produce_one(sock, no_timestamps) == (ErrorCode.none, 0)
        assert produce_one(sock, sent) == (ErrorCode.none, 2)
        stored = fetch_one(sock, TOPIC, 0, 0).records
    first = read_header(stored)
    assert (first.max_timestamp, first.base_timestamp) == (-1, -1)
    assert first.crc == crc_of(stored, 0, first.size) != read_header(no_timestamps).crc
    assert stored[len(no_timestamps) + 16:] == sent[16:]  # as sent, but offset and epoch
    assert [h.max_timestamp for h in batches_on_disk(broker, TOPIC, 0)] == \
        [-1, read_header(sent).max_timestamp]


def test_log_append_time_topics_stamp_the_broker_clock(broker):
    old = encode_batch([(b"k", b"v%d" % i, (), 1_500_000_000_000 + i) for i in range(3)],
                       CODECS["zstd"])
    with connect(broker) as sock:
        create_topic(sock, message_timestamp_type="LogAppendTime")
        before = now_ms()
        answer = produce_answer(sock, old)
        after = now_ms()
        assert answer.error_code == ErrorCode.none
        stamped = int(answer.log_append_time.timestamp() * 1000)
        assert before <= stamped <= after
        stored = fetch_one(sock, TOPIC, 0, 0).records
    header = read_header(stored)
    assert header.attributes == CODECS["zstd"] | TIMESTAMP_TYPE_BIT
    assert header.base_timestamp == header.max_timestamp == stamped
    assert header.crc == crc_of(stored, 0, header.size)
    assert stored[HEADER_SIZE:] == old[HEADER_SIZE:]


def test_a_refused_batch_with_acks_0_closes_the_connection(broker):
    with connect(broker) as setup:
        create_topic(setup)
    good = batch(2)
    with connect(broker) as sock:
        # A good batch with acks=0: no answer, and the connection goes on.
        sock.sendall(encode_request(PRODUCE, 9, 1, "t", produce_request({(TOPIC, 0): good},
                                                                         acks=0)))
        assert call(sock, API_VERSIONS, api_versions_request()).error_code == ErrorCode.none
        # A refused one: Kafka closes the connection so that the client notices.
        sock.sendall(encode_request(PRODUCE, 9, 2, "t", produce_request(
            {(TOPIC, 0): batch_of(record(0), 3, now_ms())}, acks=0)))
        assert_closed(sock)
    assert_logged(broker, "batch says 3 records but holds 1")
    with connect(broker) as sock:
        assert latest_offset(sock) == 2
    assert_nothing_stored_but(broker, [good])
    assert_serving(broker)
