"""Issue 25, SCRAM users: confluent-kafka's AdminClient describe_user_scram_credentials and
alter_user_scram_credentials (refused as unsupported before) get Kafka's answers, the users it
makes can log in and the ones it deletes cannot, and ``oncelog users`` does the same through
``--bootstrap-server --command-config`` (a Kafka tool's file, Java names and all). What is
stored is Kafka's salted form, never the password."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import time

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from oncelog.cli.main import main

TIMEOUT = 30.0


@pytest.fixture
def broker(secured):
    """The session's secured broker (tests/conftest.py): users alice and bob."""
    return secured.broker


def _logs_in(broker, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> bool:
    errors: list = []
    producer = Producer({"bootstrap.servers": broker.bootstrap_for("SASL_PLAINTEXT"),
                         "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
                         "sasl.username": user, "sasl.password": password,
                         "error_cb": errors.append})
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            producer.poll(0.05)  # error_cb runs from poll
            if errors:
                return False
            try:
                producer.list_topics(timeout=0.2)
                return True
            except KafkaException:
                continue
        raise AssertionError("neither logged in nor refused")
    finally:
        producer.flush(0)


def _error_name(future) -> str:
    with pytest.raises(KafkaException) as refused:
        future.result(TIMEOUT)
    return refused.value.args[0].name()


def test_confluent_admin_describes_and_alters_scram_users(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert _error_name(admin.describe_user_scram_credentials(["nobody"])["nobody"]) == \
        "RESOURCE_NOT_FOUND"
    done = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"dave-pw")])
    done["dave"].result(TIMEOUT)
    described = admin.describe_user_scram_credentials(["dave"])["dave"].result(TIMEOUT)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 8192)]
    assert _logs_in(broker, "dave", "dave-pw")
    assert not _logs_in(broker, "dave", "dave-pw", "SCRAM-SHA-256")  # not set for that one
    assert not _logs_in(broker, "dave", "wrong")
    # Kafka's refusals
    too_few = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"x")])
    assert _error_name(too_few["dave"]) == "UNACCEPTABLE_CREDENTIAL"
    deleted = admin.alter_user_scram_credentials([UserScramCredentialDeletion(
        "dave", ScramMechanism.SCRAM_SHA_512)])
    deleted["dave"].result(TIMEOUT)
    assert not _logs_in(broker, "dave", "dave-pw")
    again = admin.alter_user_scram_credentials([UserScramCredentialDeletion(
        "dave", ScramMechanism.SCRAM_SHA_512)])
    assert _error_name(again["dave"]) == "RESOURCE_NOT_FOUND"
    everyone = admin.describe_user_scram_credentials().result(TIMEOUT)
    assert {"alice", "bob"} <= set(everyone) and "dave" not in everyone


def _oncelog(*args: str) -> subprocess.CompletedProcess:
    """The command in this process (a process each would cost a second of imports)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_oncelog_users_through_a_broker_with_a_kafka_command_config(broker, tmp_path):
    config = tmp_path / "admin.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="alice-secret";\n')
    where = ["--bootstrap-server", broker.bootstrap_for("SASL_PLAINTEXT"),
             "--command-config", str(config)]
    added = _oncelog("users", "add", "erin", "--password", "erin-pw", *where)
    assert added.returncode == 0, added.stderr
    listed = _oncelog("users", "list", *where)
    assert listed.returncode == 0, listed.stderr
    assert [line.split() for line in listed.stdout.splitlines() if "erin" in line] == \
        [["erin", "SCRAM-SHA-256", "4096"], ["erin", "SCRAM-SHA-512", "4096"]]
    stored = json.loads(next((broker.data_dir / ".oncelog-metadata").glob("*erin*")).read_text())
    text = stored["value"]["config"]["SCRAM-SHA-512"]
    assert text.startswith("salt=") and ",stored_key=" in text and ",server_key=" in text
    assert text.endswith(",iterations=4096") and "erin-pw" not in json.dumps(stored)
    assert _logs_in(broker, "erin", "erin-pw", "SCRAM-SHA-256")
    deleted = _oncelog("users", "delete", "erin", *where)
    assert deleted.returncode == 0, deleted.stderr
    assert "erin" not in _oncelog("users", "list", *where).stdout
    wrong = config.read_text().replace("alice-secret", "nope")
    config.write_text(wrong)
    refused = _oncelog("users", "list", *where)
    assert refused.returncode == 1 and "SASL_AUTHENTICATION_FAILED" in refused.stderr


def test_users_added_to_zookeeper_log_in_to_a_cluster_broker(zookeeper, start_broker):
    """In cluster mode the users are ZooKeeper's (/config/users/<user>, Kafka's format): one
    added there before the broker starts logs in; one added through the broker is there."""
    from support.zookeepers import observer

    connect = zookeeper.chroot("users")
    added = _oncelog("users", "add", "zed", "--password", "zed-pw", "--zookeeper", connect)
    assert added.returncode == 0, added.stderr
    broker = start_broker(**{"zookeeper.connect": connect,
                             "listeners": "SASL_PLAINTEXT://127.0.0.1:0,PLAINTEXT://127.0.0.1:0",
                             "sasl.enabled.mechanisms": "SCRAM-SHA-512"})
    assert _logs_in(broker, "zed", "zed-pw")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        "yan", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"yan-pw")]
    )["yan"].result(TIMEOUT)
    zk = observer(connect)
    try:
        data, _ = zk.get("/config/users/yan")
    finally:
        zk.stop()
        zk.close()
    stored = json.loads(data)
    assert stored["version"] == 1 and set(stored["config"]) == {"SCRAM-SHA-256"}
    assert stored["config"]["SCRAM-SHA-256"].endswith(",iterations=4096")
    listed = _oncelog("users", "list", "--zookeeper", connect)
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == \
        ["yan", "zed", "zed"]


def test_a_kafka_tools_mutual_tls_command_config_works(secured, tmp_path):
    """Java's PEM names (ssl.truststore.location, ssl.keystore.location with certificate and
    key) are read as librdkafka's, for every client command."""
    both = tmp_path / "carol.pem"
    both.write_bytes(secured.client.cert.read_bytes() + secured.client.key.read_bytes())
    config = tmp_path / "mtls.properties"
    config.write_text(f"security.protocol=SSL\nssl.truststore.type=PEM\n"
                      f"ssl.truststore.location={secured.ca.pem}\nssl.keystore.type=PEM\n"
                      f"ssl.keystore.location={both}\n")
    where = ["--bootstrap-server", secured.bootstrap("SSL"), "--command-config", str(config)]
    created = _oncelog("topics", "create", "--topic", "cli-mtls", *where)
    assert created.returncode == 0, created.stderr
    listed = _oncelog("topics", "list", *where)
    assert "cli-mtls" in listed.stdout.split()
    config.write_text("security.protocol=SSL\nssl.truststore.location=/nonexistent.pem\n")
    with pytest.raises(SystemExit, match=r"ssl\.ca\.location: /nonexistent\.pem: no such file"):
        _oncelog("topics", "list", *where)
