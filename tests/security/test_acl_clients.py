"""The peer clients' own ACL calls against the broker with an authorizer (confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient), and an idempotent confluent-kafka producer
refused with Kafka's error without the ACLs it needs and producing with them.

One broker for the module; User:ANONYMOUS (every client here) may manage ACLs and create
topics: Cluster Alter, Describe and Create, seeded in its store before it starts."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AclBinding as CkBinding
from confluent_kafka.admin import AclBindingFilter as CkFilter
from confluent_kafka.admin import AclOperation as CkOp
from confluent_kafka.admin import AclPermissionType as CkPerm
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.admin import ResourcePatternType as CkPattern
from confluent_kafka.admin import ResourceType as CkType
from kio.schema.errors import ErrorCode as E
from support.acl_wire import ANONYMOUS, AUTHORIZER, METADATA_DIR, Wire
from support.brokers import BrokerProcess

from oncelog.cli.acls import HEADERS
from oncelog.cli.main import main
from oncelog.metadata.store import LocalFileStore
from oncelog.protocol import api_versions as apis
from oncelog.protocol.schema import build
from oncelog.security.acl_store import AclStore
from oncelog.security.acls import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)

TIMEOUT = 15.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("acl-clients") / "broker"
    AclStore(LocalFileStore(str(data_dir / METADATA_DIR))).create([
        AclBinding(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
                   AccessControlEntry(ANONYMOUS, "*", op, AclPermissionType.ALLOW))
        for op in (AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CREATE)])
    process = BrokerProcess(data_dir, {"authorizer.class.name": AUTHORIZER}).start()
    yield process
    assert process.stop() == 0, process.log_text()
    assert "Traceback" not in process.log_text(), process.log_text()


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


EVERYTHING = CkFilter(CkType.ANY, None, CkPattern.ANY, None, None, CkOp.ANY, CkPerm.ANY)


def test_confluent_admin_creates_describes_deletes(admin):
    name = f"ck-{uuid.uuid4().hex[:6]}"
    read = CkBinding(CkType.TOPIC, name, CkPattern.LITERAL, "User:alice", "*", CkOp.READ,
                     CkPerm.ALLOW)
    deny = CkBinding(CkType.GROUP, name, CkPattern.PREFIXED, "User:bob", "10.0.0.1",
                     CkOp.ALL, CkPerm.DENY)
    for future in admin.create_acls([read, deny], request_timeout=TIMEOUT).values():
        assert future.result() is None
    mine = CkFilter(CkType.ANY, name, CkPattern.ANY, None, None, CkOp.ANY, CkPerm.ANY)
    assert sorted(map(str, admin.describe_acls(mine).result(TIMEOUT))) == \
        sorted(map(str, [read, deny]))
    # MATCH: the ACLs that apply to a group named name + "-1": the prefixed one
    applying = CkFilter(CkType.GROUP, name + "-1", CkPattern.MATCH, None, None, CkOp.ANY,
                        CkPerm.ANY)
    assert admin.describe_acls(applying).result(TIMEOUT) == [deny]
    deleted = admin.delete_acls([CkFilter(CkType.TOPIC, name, CkPattern.LITERAL, None, None,
                                          CkOp.ANY, CkPerm.ANY)], request_timeout=TIMEOUT)
    assert [f.result() for f in deleted.values()] == [[read]]
    assert admin.describe_acls(mine).result(TIMEOUT) == [deny]


def test_confluent_admin_invalid_creation_is_refused(admin):
    # The cluster has one name: Kafka answers INVALID_REQUEST for any other.
    bad = CkBinding(CkType.BROKER, "other-cluster", CkPattern.LITERAL, "User:alice", "*",
                    CkOp.ALTER, CkPerm.ALLOW)
    (future,) = admin.create_acls([bad], request_timeout=TIMEOUT).values()
    with pytest.raises(Exception) as caught:
        future.result()
    assert caught.value.args[0].code() == KafkaError.INVALID_REQUEST


def test_kafka_python_acl_calls(broker):
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourcePattern as KpPattern
    from kafka.admin import ResourceType as KpType

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=15_000)
    try:
        name = f"kp-{uuid.uuid4().hex[:6]}"
        acl = ACL("User:carol", "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                  KpPattern(KpType.TOPIC, name, ACLResourcePatternType.PREFIXED))
        result = client.create_acls([acl])
        assert result["failed"] == [] and len(result["succeeded"]) == 1
        wanted = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                           ResourcePatternFilter(KpType.TOPIC, name, ACLResourcePatternType.ANY))
        found, error = client.describe_acls(wanted)
        assert error.errno == 0
        assert [(a.principal, a.operation, a.resource_pattern.resource_name) for a in found] \
            == [("User:carol", ACLOperation.WRITE, name)]
        ((_, matched, error),) = client.delete_acls([wanted])
        assert error.errno == 0 and len(matched) == 1
        assert client.describe_acls(wanted)[0] == []
    finally:
        client.close()


def test_idempotent_producer_needs_its_acls(broker, admin):
    topic = f"idem-{uuid.uuid4().hex[:6]}"
    (created,) = admin.create_topics([NewTopic(topic, 1, 1)],
                                     request_timeout=TIMEOUT).values()
    created.result()

    def produce() -> KafkaError | None:
        """The record's delivery error, or the producer's fatal one (raised by flush)."""
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                             "message.timeout.ms": 5000})
        delivered: list[KafkaError | None] = []
        try:
            producer.produce(topic, b"v", on_delivery=lambda err, msg: delivered.append(err))
            producer.flush(10)
        except (KafkaException, SystemError) as exc:
            # librdkafka's fatal error is raised from flush; while a delivery report is
            # being handed over, as the cause of a SystemError
            cause = exc if isinstance(exc, KafkaException) else exc.__cause__
            assert isinstance(cause, KafkaException), exc
            return cause.args[0]
        finally:
            del producer
        assert len(delivered) == 1
        return delivered[0]

    def grant(*bindings: CkBinding) -> None:
        for future in admin.create_acls(list(bindings), request_timeout=TIMEOUT).values():
            future.result()

    def on_topic(op) -> CkBinding:
        return CkBinding(CkType.TOPIC, topic, CkPattern.LITERAL, ANONYMOUS, "*", op,
                         CkPerm.ALLOW)

    # Describe on the topic only: its metadata is there, but neither IdempotentWrite on the
    # cluster nor Write on any topic, so InitProducerId is refused (fatal for the producer).
    grant(on_topic(CkOp.DESCRIBE))
    refused = produce()
    assert refused is not None and refused.code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, \
        refused
    # IdempotentWrite on the cluster: a producer id, but no Write on the topic.
    grant(CkBinding(CkType.BROKER, CLUSTER_NAME, CkPattern.LITERAL, ANONYMOUS, "*",
                    CkOp.IDEMPOTENT_WRITE, CkPerm.ALLOW))
    refused = produce()
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, \
        refused
    grant(on_topic(CkOp.WRITE))
    assert produce() is None


def run_cli(capsys, broker, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["acls", *args[:1], "--bootstrap-server", broker.bootstrap, *args[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_oncelog_acls_command(broker, capsys):
    code, out, _ = run_cli(capsys, broker, "add", "--allow-principal", "User:dave",
                           "--operation", "Read", "--operation", "describe", "--topic", "cli-",
                           "--group", "cli-g", "--resource-pattern-type", "prefixed")
    assert code == 0, out
    assert out.splitlines()[1].split() == list(HEADERS)
    code, out, _ = run_cli(capsys, broker, "list", "--principal", "User:dave")
    assert code == 0
    assert [line.split() for line in out.splitlines()[1:]] == [
        ["Group", "cli-g", "PREFIXED", "User:dave", "*", "Describe", "Allow"],
        ["Group", "cli-g", "PREFIXED", "User:dave", "*", "Read", "Allow"],
        ["Topic", "cli-", "PREFIXED", "User:dave", "*", "Describe", "Allow"],
        ["Topic", "cli-", "PREFIXED", "User:dave", "*", "Read", "Allow"]]
    # match: the ACLs that apply to the topic cli-orders
    code, out, _ = run_cli(capsys, broker, "list", "--topic", "cli-orders",
                           "--resource-pattern-type", "match")
    assert {line.split()[1] for line in out.splitlines()[1:]} == {"cli-"}
    code, out, _ = run_cli(capsys, broker, "add", "--allow-principal", "User:app", "--producer",
                           "--idempotent", "--topic", "cli-p", "--transactional-id", "cli-tx")
    assert code == 0
    code, out, _ = run_cli(capsys, broker, "list", "--principal", "User:app")
    assert sorted((row[0], row[5]) for row in (line.split() for line in out.splitlines()[1:])) \
        == [("Cluster", "IdempotentWrite"), ("Topic", "Create"), ("Topic", "Describe"),
            ("Topic", "Write"), ("TransactionalId", "Describe"), ("TransactionalId", "Write")]
    code, out, _ = run_cli(capsys, broker, "remove", "--allow-principal", "User:dave",
                           "--topic", "cli-", "--resource-pattern-type", "prefixed", "--force")
    assert code == 0 and out.startswith("Removed 2 ACL(s):")
    code, out, _ = run_cli(capsys, broker, "list", "--principal", "User:dave")
    assert {line.split()[0] for line in out.splitlines()[1:]} == {"Group"}
    code, _, err = run_cli(capsys, broker, "add", "--allow-principal", "User:x",
                           "--operation", "Fly", "--topic", "t")
    assert code == 2 and "unknown operation 'Fly'" in err
    code, _, err = run_cli(capsys, broker, "add", "--allow-principal", "alice", "--topic", "t")
    assert code == 1 and "INVALID_REQUEST" in err.upper(), err


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_version_of_the_acl_apis(broker, version):
    """Raw requests of each advertised version; a filter with an UNKNOWN element and a
    creation with an unknown operation code are answered INVALID_REQUEST."""
    wire = Wire(broker.port, "127.0.0.1")
    name = f"v{version}-{uuid.uuid4().hex[:6]}"

    def creation(m, operation: int):
        return build(m.AclCreation, resource_type=int(ResourceType.TOPIC), resource_name=name,
                     resource_pattern_type=int(PatternType.PREFIXED), principal="User:v",
                     host="*", operation=operation,
                     permission_type=int(AclPermissionType.ALLOW))

    def acl_filter(cls, resource_type: int = int(ResourceType.TOPIC)):
        return build(cls, resource_type_filter=resource_type, resource_name_filter=name,
                     pattern_type_filter=int(PatternType.ANY), principal_filter=None,
                     host_filter=None, operation=int(AclOperation.ANY),
                     permission_type=int(AclPermissionType.ANY))

    try:
        created = wire.call(apis.CREATE_ACLS, lambda m, v: build(
            m.CreateAclsRequest, creations=(creation(m, int(AclOperation.WRITE)),
                                            creation(m, 99))), version)
        assert [r.error_code for r in created.results] == [E.none, E.invalid_request]
        described = wire.call(apis.DESCRIBE_ACLS, lambda m, v: acl_filter(
            m.DescribeAclsRequest), version)
        assert described.error_code == E.none
        assert [(r.resource_name, r.pattern_type, [a.operation for a in r.acls])
                for r in described.resources] == [(name, PatternType.PREFIXED,
                                                   [AclOperation.WRITE])]
        unknown = wire.call(apis.DESCRIBE_ACLS, lambda m, v: acl_filter(
            m.DescribeAclsRequest, int(ResourceType.UNKNOWN)), version)
        assert unknown.error_code == E.invalid_request
        deleted = wire.call(apis.DELETE_ACLS, lambda m, v: build(
            m.DeleteAclsRequest, filters=(acl_filter(m.DeleteAclsFilter),
                                          acl_filter(m.DeleteAclsFilter, 0))), version)
        assert [(r.error_code, len(r.matching_acls)) for r in deleted.filter_results] == \
            [(E.none, 1), (E.invalid_request, 0)]
    finally:
        wire.close()
