"""DescribeCluster, DescribeTopicPartitions (KIP-966), DescribeLogDirs and the authorized
operations of Metadata and DescribeGroups, asked by kafka-python's KafkaAdminClient,
confluent-kafka's AdminClient and oncelog's Admin, against one broker with two log
directories.

Without an authorizer Kafka answers every operation a resource type supports; those sets
(AclEntry.supportedOperations) are written out here by name, not taken from the broker's code.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode
from support.broker_forks import run_oncelog
from support.brokers import START_TIMEOUT, BrokerProcess, create_topic

from oncelog.client.admin.admin import Admin
from oncelog.client.network.connection import KafkaError, connect
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build

CLUSTER_OPS = {"CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
               "IDEMPOTENT_WRITE", "ALTER", "DESCRIBE"}
TOPIC_OPS = {"READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS",
             "ALTER_CONFIGS"}
GROUP_OPS = {"READ", "DESCRIBE", "DELETE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
OMITTED = -(1 << 31)


@pytest.fixture(scope="module")
def jbod(tmp_path_factory):
    base = tmp_path_factory.mktemp("views")
    a, b = base / "a", base / "b"
    broker = BrokerProcess(a, {"log.dirs": f"{a},{b}"}).start()
    create_topic(broker.bootstrap, "alpha", 3)
    create_topic(broker.bootstrap, "beta", 2)
    create_topic(broker.bootstrap, "gamma", 4)
    yield broker, a, b
    assert broker.stop() == 0
    assert "Traceback" not in broker.log_text(), broker.log_text()


@pytest.fixture(scope="module")
def kafka_python(jbod):
    admin = KafkaAdminClient(bootstrap_servers=jbod[0].bootstrap)
    yield admin
    admin.close()


@pytest.fixture(scope="module")
def confluent(jbod):
    return AdminClient({"bootstrap.servers": jbod[0].bootstrap})


def _names(operations) -> set[str]:
    return {op.name for op in operations}


# --- ApiVersions ---------------------------------------------------------------------------

def test_kafka_python_infers_a_modern_broker_and_each_view_is_advertised(kafka_python):
    data = kafka_python._manager.broker_version_data
    assert data.broker_version >= (4, 0), data  # DescribeLogDirs v5: Kafka 4.3's
    advertised = kafka_python.api_versions()
    for key, (lo, hi) in ((34, (1, 2)), (35, (1, 5)), (60, (0, 2)), (75, (0, 0))):
        assert advertised[key] == (lo, hi)
    assert set(apis.SUPPORTED_VERSIONS) == {int(k) for k in advertised}


# --- DescribeCluster -----------------------------------------------------------------------

def test_describe_cluster_from_three_clients(jbod, kafka_python, confluent):
    broker = jbod[0]
    port = broker.port
    kp = kafka_python.describe_cluster()
    assert kp["controller_id"] == 0
    assert kp["brokers"] == [{"broker_id": 0, "host": "127.0.0.1", "port": port, "rack": None,
                              "is_fenced": False}]
    assert set(kp["authorized_operations"]) == CLUSTER_OPS

    ck = confluent.describe_cluster(include_authorized_operations=True).result(START_TIMEOUT)
    assert ck.cluster_id == kp["cluster_id"]
    assert ck.controller.id == 0 and [(n.id, n.host, n.port) for n in ck.nodes] == \
        [(0, "127.0.0.1", port)]
    assert _names(ck.authorized_operations) == CLUSTER_OPS
    plain = confluent.describe_cluster().result(START_TIMEOUT)
    assert not plain.authorized_operations  # not asked: omitted

    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        ours = admin.describe_cluster(include_authorized_operations=True)
        assert ours.cluster_id == kp["cluster_id"] and ours.controller_id == 0
        assert [(b.node_id, b.port) for b in ours.brokers] == [(0, port)]
        assert ours.authorized_operations == CLUSTER_OPS
        assert admin.describe_cluster().authorized_operations is None


@pytest.mark.parametrize(("version", "endpoint", "error"), [
    (1, 2, ErrorCode.mismatched_endpoint_type),
    (1, 7, ErrorCode.unsupported_endpoint_type),
    (2, 2, ErrorCode.mismatched_endpoint_type),
])
def test_describe_cluster_for_controllers_is_refused_with_a_message(jbod, version, endpoint,
                                                                    error):
    with connect(jbod[0].bootstrap) as conn:
        conn.versions[apis.DESCRIBE_CLUSTER] = version
        response = conn.call(apis.DESCRIBE_CLUSTER, lambda mod, v: build(
            mod.DescribeClusterRequest, include_cluster_authorized_operations=True,
            endpoint_type=endpoint, include_fenced_brokers=False))
    assert response.error_code == error
    assert str(endpoint) in response.error_message
    assert response.brokers == ()


# --- Metadata and DescribeGroups: authorized operations ------------------------------------

def test_metadata_answers_authorized_operations_only_when_asked(jbod, kafka_python):
    (topic,) = kafka_python.describe_topics(["alpha"])
    assert set(topic["authorized_operations"]) == TOPIC_OPS
    with connect(jbod[0].bootstrap) as conn:
        def metadata(asked: bool):
            return conn.call(apis.METADATA, lambda mod, v: build(
                mod.MetadataRequest, topics=(build(mod.MetadataRequestTopic, name="alpha",
                                                   topic_id=None),),
                allow_auto_topic_creation=False, include_topic_authorized_operations=asked,
                include_cluster_authorized_operations=asked))

        conn.versions[apis.METADATA] = 8  # the last version with the cluster's field
        asked, not_asked = metadata(True), metadata(False)
    assert asked.topics[0].topic_authorized_operations == sum(
        1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
    assert asked.cluster_authorized_operations == sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
    assert not_asked.topics[0].topic_authorized_operations == OMITTED
    assert not_asked.cluster_authorized_operations == OMITTED


def test_describe_groups_answers_authorized_operations(jbod, kafka_python, confluent):
    bootstrap = jbod[0].bootstrap
    consumer = ConfluentConsumer({"bootstrap.servers": bootstrap, "group.id": "viewers",
                                  "session.timeout.ms": 6000})
    try:
        consumer.subscribe(["alpha"])
        for _ in range(60):
            consumer.poll(0.5)
            if consumer.assignment():
                break
        assert consumer.assignment(), "the consumer never joined"
        # kafka-python always asks for them (DescribeGroups v3+)
        described = kafka_python.describe_groups(["viewers"])["viewers"]
        assert {str(getattr(op, "name", op)) for op in described["authorized_operations"]} \
            == GROUP_OPS
        group = confluent.describe_consumer_groups(
            ["viewers"], include_authorized_operations=True)["viewers"].result(START_TIMEOUT)
        assert _names(group.authorized_operations) == GROUP_OPS
    finally:
        consumer.close()


# --- DescribeTopicPartitions ----------------------------------------------------------------

def test_confluent_describe_topics_uses_describe_topic_partitions(jbod, confluent):
    found = confluent.describe_topics(TopicCollection(["gamma", "alpha"]),
                                      include_authorized_operations=True)
    gamma = found["gamma"].result(START_TIMEOUT)
    assert [p.id for p in gamma.partitions] == [0, 1, 2, 3]
    assert all(p.leader.id == 0 and [r.id for r in p.replicas] == [0] for p in gamma.partitions)
    assert _names(gamma.authorized_operations) == TOPIC_OPS
    assert AclOperation.WRITE in found["alpha"].result(START_TIMEOUT).authorized_operations
    missing = confluent.describe_topics(TopicCollection(["no-such-topic"]))["no-such-topic"]
    with pytest.raises(Exception, match=r"(?i)unknown topic"):
        missing.result(START_TIMEOUT)


def _page(conn, names, limit, cursor=None):
    return conn.call(apis.DESCRIBE_TOPIC_PARTITIONS, lambda mod, v: build(
        mod.DescribeTopicPartitionsRequest,
        topics=tuple(build(mod.TopicRequest, name=n) for n in names),
        response_partition_limit=limit,
        cursor=None if cursor is None else build(mod.Cursor, topic_name=cursor[0],
                                                 partition_index=cursor[1])))


def _pages(conn, names, limit, cursor=None):
    """Every page: [(topic, [partition indexes]) ...] and the cursor each page gave."""
    pages = []
    for _ in range(50):
        response = _page(conn, names, limit, cursor)
        nxt = response.next_cursor
        pages.append(([(t.name, [p.partition_index for p in t.partitions], t.error_code)
                       for t in response.topics],
                      None if nxt is None else (nxt.topic_name, nxt.partition_index)))
        if nxt is None:
            return pages
        cursor = (nxt.topic_name, nxt.partition_index)
    raise AssertionError("the cursor never ended")


def test_describe_topic_partitions_pages_by_cursor_as_kafka_does(jbod):
    none = ErrorCode.none
    with connect(jbod[0].bootstrap) as conn:
        # all topics in name order, from "alpha" on (past "__consumer_offsets")
        pages = _pages(conn, [], 2, ("alpha", 0))
        assert pages == [
            ([("alpha", [0, 1], none)], ("alpha", 2)),
            ([("alpha", [2], none), ("beta", [0], none)], ("beta", 1)),
            ([("beta", [1], none), ("gamma", [0], none)], ("gamma", 1)),
            ([("gamma", [1, 2], none)], ("gamma", 3)),
            ([("gamma", [3], none)], None),
        ]
        # the limit used up at a topic's end: the cursor is the next topic, at 0
        assert _pages(conn, [], 3, ("alpha", 0))[0] == ([("alpha", [0, 1, 2], none)],
                                                       ("beta", 0))
        # named topics, an unknown one among them: it costs nothing and is answered
        assert _pages(conn, ["gamma", "nope", "beta"], 3) == [
            ([("beta", [0, 1], none), ("gamma", [0], none)], ("gamma", 1)),
            ([("gamma", [1, 2, 3], none)], ("nope", 0)),
            ([("nope", [], ErrorCode.unknown_topic_or_partition)], None),
        ]
        # one page for everything
        assert _pages(conn, ["alpha", "beta"], 2000) == [
            ([("alpha", [0, 1, 2], none), ("beta", [0, 1], none)], None)]
        # a cursor on a topic that was not asked for
        refused = _page(conn, ["alpha"], 10, ("beta", 0))
        assert [(t.name, t.error_code) for t in refused.topics] == \
            [("alpha", ErrorCode.invalid_request)]
        # a cursor past a topic's last partition: nothing of it, then the next topic
        past = _page(conn, ["alpha", "beta"], 10, ("alpha", 7))
        assert [(t.name, len(t.partitions)) for t in past.topics] == [("alpha", 0), ("beta", 2)]


def test_oncelog_admin_reads_every_page(jbod):
    with Admin({"bootstrap.servers": jbod[0].bootstrap}) as admin:
        described = admin.describe_topic_partitions(page_size=1)
        assert {name: [p.index for p in t.partitions] for name, t in described.items()
                if not t.is_internal} == {"alpha": [0, 1, 2], "beta": [0, 1],
                                          "gamma": [0, 1, 2, 3]}
        assert described["beta"].authorized_operations == TOPIC_OPS
        with pytest.raises(KafkaError, match=r"UNKNOWN_TOPIC_OR_PARTITION.*'nope'"):
            admin.describe_topic_partitions(["alpha", "nope"])


# --- DescribeLogDirs -------------------------------------------------------------------------

def _placement(dirs) -> dict[str, set[str]]:
    return {d["log_dir"]: {f"{t['name']}-{p['partition_index']}" for t in d["topics"]
                           for p in t["partitions"]} for d in dirs}


def test_describe_log_dirs_from_three_clients(jbod, kafka_python, confluent):
    broker, a, b = jbod
    ((only,),) = [[r] for r in kafka_python.describe_log_dirs()]
    assert only["broker"] == 0
    placed = _placement(only["log_dirs"])
    assert set(placed) == {str(a), str(b)}
    ours = {f"{t}-{p}" for t, n in (("alpha", 3), ("beta", 2), ("gamma", 4)) for p in range(n)}
    # spread at creation: each directory got the one with fewer partitions, in turn
    assert placed[str(a)] & ours == {"alpha-0", "alpha-2", "beta-1", "gamma-1", "gamma-3"}
    assert placed[str(b)] & ours == {"alpha-1", "beta-0", "gamma-0", "gamma-2"}
    for d in only["log_dirs"]:
        assert d["error_code"] == 0 and d["total_bytes"] > 0 and 0 <= d["usable_bytes"]
        for t in d["topics"]:
            for p in t["partitions"]:
                assert p["offset_lag"] == 0 and not p["is_future_key"]
    filtered = kafka_python.describe_log_dirs({"alpha": [1]})
    assert _placement(filtered[0]["log_dirs"]) == {str(a): set(), str(b): {"alpha-1"}}

    with Admin({"bootstrap.servers": broker.bootstrap}) as admin:
        (dirs,) = admin.describe_log_dirs({"gamma": [0, 1, 2, 3]}).values()
    assert {d.path: {(r.topic, r.partition) for r in d.replicas} for d in dirs} == {
        str(a): {("gamma", 1), ("gamma", 3)}, str(b): {("gamma", 0), ("gamma", 2)}}

    described = run_oncelog("log-dirs", "describe", "--bootstrap-server", broker.bootstrap,
                            "--topic-list", "beta", timeout=60)
    assert described.returncode == 0, described.stderr
    first, second, body = described.stdout.splitlines()
    assert first == "Querying brokers for log directories information"
    assert second == "Received log directory information from brokers 0"
    shown = json.loads(body)
    assert shown["version"] == 1
    assert {d["logDir"]: [p["partition"] for p in d["partitions"]]
            for d in shown["brokers"][0]["logDirs"]} == {str(a): ["beta-1"], str(b): ["beta-0"]}


def test_cluster_describe_command(jbod):
    described = run_oncelog("cluster", "describe", "--bootstrap-server", jbod[0].bootstrap,
                            timeout=60)
    assert described.returncode == 0, described.stderr
    assert "Controller: 0" in described.stdout
    assert f"Broker: 0\tEndpoint: 127.0.0.1:{jbod[0].port}" in described.stdout
    assert "IDEMPOTENT_WRITE" in described.stdout
