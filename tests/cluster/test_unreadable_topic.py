"""One topic whose znodes cannot be read stops nothing else (issue 23's poison pill).

On a real ZooKeeper and three broker processes: topic ``bad``'s config znode gets an ACL
that refuses the brokers (NoAuth) and one of its partition state znodes is overwritten with
bytes that are not JSON. Before, every controller pass, every ElectLeaders and every
metadata cache refresh raised on them: no leader was elected for any topic, and topics
created afterwards never reached Metadata. Now the controller leaves that topic alone and
says so once, elects the others: the leader of ``good``'s partition killed with SIGKILL is
replaced and librdkafka produces to the new one; a topic created after the damage is in
Metadata; ElectLeaders answers ``bad``'s partitions with an error, the others with theirs.
"""

from __future__ import annotations

import json
import re

import pytest
from kazoo.security import make_digest_acl
from support.three_brokers import SESSION_MS, TIMEOUT, ThreeBrokers
from support.waits import wait_for

from oncelog.cluster import znodes as zn

pytestmark = pytest.mark.xdist_group("zookeeper")


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory):
    running = ThreeBrokers(zookeeper, tmp_path_factory.mktemp("unreadable"), "unreadable",
                           {"default.replication.factor": "3"})
    yield running
    running.close()


def _admin(cluster):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": ",".join(
        b.bootstrap for b in cluster.brokers.values())})


def _state(cluster, topic: str, p: int) -> dict:
    return json.loads(cluster.zk.get(zn.partition_state_path(topic, p))[0])


def _controller(cluster) -> int:
    return json.loads(cluster.zk.get(zn.CONTROLLER)[0])["brokerid"]


def test_one_unreadable_topic_stops_no_election_elsewhere(cluster):
    from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import NewTopic

    admin = _admin(cluster)
    for name in ("good", "bad"):
        admin.create_topics([NewTopic(name, 2, 3)])[name].result(TIMEOUT)
    for name in ("good", "bad"):
        wait_for(lambda n=name: all(len(_state(cluster, n, p)["isr"]) == 3 for p in (0, 1)),
                 TIMEOUT, f"{name}'s ISRs of three")
    cluster.zk.set_acls(zn.topic_config_path("bad"),
                        [make_digest_acl("someone-else", "secret", all=True)])
    cluster.zk.set(zn.partition_state_path("bad", 1), b"\x00 not json")
    controller = _controller(cluster)
    p, state = next((p, s) for p in (0, 1)
                    if (s := _state(cluster, "good", p))["leader"] != controller)
    dead = state["leader"]
    cluster.brokers[dead].kill()
    # elected within the session timeout (the kill's registration to expire) and a pass
    new = wait_for(lambda: (s := _state(cluster, "good", p))["leader"] not in (dead, -1) and s,
                   SESSION_MS / 1000 + 10, f"a new leader of good-{p}")
    assert new["leader_epoch"] == state["leader_epoch"] + 1 and dead not in new["isr"]

    delivered: list = []
    producer = Producer({"bootstrap.servers": cluster.brokers[new["leader"]].bootstrap,
                         "acks": "all", "message.timeout.ms": int(TIMEOUT * 1000)})
    producer.produce("good", b"after", partition=p,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(TIMEOUT) == 0
    assert delivered and delivered[0][0] is None, delivered

    # metadata keeps flowing: a topic made after the damage reaches every live broker's cache
    admin.create_topics([NewTopic("later", 1, 2)])["later"].result(TIMEOUT)
    live = [b for b in cluster.brokers.values() if b.alive]
    for broker in live:
        from confluent_kafka.admin import AdminClient

        one = AdminClient({"bootstrap.servers": broker.bootstrap})
        wait_for(lambda a=one: (t := a.list_topics("later", timeout=TIMEOUT).topics["later"])
                 .error is None and all(q.leader >= 0 for q in t.partitions.values()),
                 TIMEOUT, f"'later' led in {broker.bootstrap}'s Metadata")

    # ElectLeaders: each partition its own answer (bad's an error, good's theirs)
    def elected():
        asking = _admin(cluster)  # kept while its future runs
        try:
            return asking.elect_leaders(ElectionType.PREFERRED, [
                TopicPartition(t, q) for t in ("good", "bad") for q in (0, 1)]).result(TIMEOUT)
        except Exception as exc:  # the controller moved: ask the new one
            assert "NOT_CONTROLLER" in str(exc), exc
            return None

    answers = {(tp.topic, tp.partition): err
               for tp, err in wait_for(elected, TIMEOUT, "ElectLeaders answered", 0.2).items()}
    for q in (0, 1):
        assert answers[("bad", q)] is not None
        assert answers[("bad", q)].code() == KafkaError.UNKNOWN, answers[("bad", q)]
        assert "cannot be read" in answers[("bad", q)].str()
    for q in (0, 1):  # decided as ever: not needed, or the preferred replica is the dead one
        assert answers[("good", q)] is not None and answers[("good", q)].code() in (
            KafkaError.ELECTION_NOT_NEEDED, KafkaError.PREFERRED_LEADER_NOT_AVAILABLE)

    # said once per reader, not at every pass (passes run every third of the session timeout)
    for broker in live:
        text = broker.log_text()
        lines = [line for line in text.splitlines() if "elect leaders of" not in line
                 and re.search(r"topic bad\b.*cannot be read|bad-1.*cannot be read", line)]
        assert lines, text[-3000:]
        assert len(lines) <= 6, lines  # config and state, each by at most three readers

    # repaired: read again, and elected again as any other topic
    from kazoo.security import OPEN_ACL_UNSAFE

    cluster.zk.add_auth("digest", "someone-else:secret")  # ADMIN on it, to lift its ACL
    cluster.zk.set_acls(zn.topic_config_path("bad"), OPEN_ACL_UNSAFE)
    cluster.zk.set(zn.partition_state_path("bad", 1), json.dumps(
        {"controller_epoch": 1, "leader": dead, "version": 1, "leader_epoch": 50,
         "isr": [dead]}).encode())
    wait_for(lambda: _state(cluster, "bad", 1)["leader_epoch"] == 51, TIMEOUT,
             "bad-1 repaired and its dead leader replaced")
    cluster.brokers[dead].start()



def _watermarks(cluster, leader: int, topic: str) -> tuple[int, int]:
    """(low, high) of ``topic``-0 as its leader answers them."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": cluster.brokers[leader].bootstrap,
                         "group.id": f"{topic}-check"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT)
    finally:
        consumer.close()


def _live(cluster) -> list[int]:
    return sorted(i for i, b in cluster.brokers.items() if b.alive)


def test_an_assignment_without_topic_id_is_named_by_the_controller(cluster):
    """leader_election.py T1: pre-2.8 tooling (kafka-topics.sh --zookeeper, AdminZkClient)
    writes version 1 without a topic_id; the controller names it, the topic gets leaders
    and takes a produce. Before: unreadable for good (no leader, ever)."""
    from confluent_kafka import Producer

    replicas = _live(cluster)[:2]
    cluster.zk.create(zn.topic_path("legacy"), json.dumps(
        {"version": 1, "partitions": {"0": replicas}}).encode())
    named = wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy"))[0])
                     .get("topic_id"), TIMEOUT, "legacy named by the controller")
    assert zn.decode_topic_id(named)
    assignment = zn.TopicAssignment.decode(cluster.zk.get(zn.topic_path("legacy"))[0])
    assert assignment.partitions == {0: tuple(replicas)}
    state = wait_for(lambda: cluster.zk.exists(zn.partition_state_path("legacy", 0))
                     and _state(cluster, "legacy", 0), TIMEOUT, "legacy-0 led")
    assert state["leader"] in replicas
    delivered: list = []
    producer = Producer({"bootstrap.servers": cluster.brokers[state["leader"]].bootstrap,
                         "acks": "all", "message.timeout.ms": int(TIMEOUT * 1000)})
    producer.produce("legacy", b"named", partition=0,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(TIMEOUT) == 0
    assert delivered == [(None, 0)], delivered

    # rewritten by an old tool (no topic_id again): named with the id it had, so no broker
    # takes it for a new topic and deletes its log
    cluster.zk.set(zn.topic_path("legacy"), json.dumps(
        {"version": 1, "partitions": {"0": replicas}}).encode())
    wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy"))[0])
             .get("topic_id"), TIMEOUT, "legacy named again")
    assert zn.TopicAssignment.decode(
        cluster.zk.get(zn.topic_path("legacy"))[0]).topic_id == named
    assert _watermarks(cluster, state["leader"], "legacy") == (0, 1)


def test_a_topic_rewritten_without_id_keeps_its_id_across_a_controller_change(cluster):
    """An old tool rewrites a named topic without its topic_id while the controller is stopped,
    and that controller dies before naming it: the next controller has read no id of it, and
    names it with the id its own broker's metadata cache last read. Before:
    a new id, and every replica took the topic for a new one and deleted its log (the record
    below, acknowledged by both replicas, lost)."""
    import os
    import signal

    from confluent_kafka import Producer
    from kazoo.exceptions import NoNodeError

    replicas = _live(cluster)[:2]
    cluster.zk.create(zn.topic_path("legacy2"), json.dumps(
        {"version": 1, "partitions": {"0": replicas}}).encode())
    named = wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy2"))[0])
                     .get("topic_id"), TIMEOUT, "legacy2 named by the controller")
    wait_for(lambda: cluster.zk.exists(zn.partition_state_path("legacy2", 0))
             and len(_state(cluster, "legacy2", 0)["isr"]) == 2, TIMEOUT, "legacy2-0's ISR")
    leader = _state(cluster, "legacy2", 0)["leader"]
    producer = Producer({"bootstrap.servers": cluster.brokers[leader].bootstrap,
                         "acks": "all", "message.timeout.ms": int(TIMEOUT * 1000)})
    delivered: list = []
    producer.produce("legacy2", b"kept", partition=0,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(TIMEOUT) == 0 and delivered == [(None, 0)], delivered

    old = _controller(cluster)
    stopped = cluster.brokers[old]
    os.kill(stopped.proc.pid, signal.SIGSTOP)
    try:
        cluster.zk.set(zn.topic_path("legacy2"), json.dumps(
            {"version": 1, "partitions": {"0": replicas}}).encode())
    finally:
        stopped.kill()  # dies stopped: it never named it
    try:
        def another() -> bool:
            try:
                return _controller(cluster) != old
            except NoNodeError:  # the old session expired between two reads: none yet
                return False

        wait_for(another, SESSION_MS / 1000 + 10, "another controller")
        again = wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy2"))[0])
                         .get("topic_id"), TIMEOUT, "legacy2 named by the next controller")
        assert again == named
        state = wait_for(lambda: (s := _state(cluster, "legacy2", 0))["leader"] not in (old, -1)
                         and s, TIMEOUT, "legacy2-0 led by a live broker")
        assert _watermarks(cluster, state["leader"], "legacy2") == (0, 1)
    finally:
        stopped.start()


def _produce_one(cluster, topic: str, value: bytes) -> int:
    """A record in ``topic``-0 acknowledged by its whole ISR (two replicas): the leader."""
    from confluent_kafka import Producer

    wait_for(lambda: cluster.zk.exists(zn.partition_state_path(topic, 0))
             and len(_state(cluster, topic, 0)["isr"]) == 2, TIMEOUT, f"{topic}-0's ISR")
    leader = _state(cluster, topic, 0)["leader"]
    producer = Producer({"bootstrap.servers": cluster.brokers[leader].bootstrap,
                         "acks": "all", "message.timeout.ms": int(TIMEOUT * 1000)})
    delivered: list = []
    producer.produce(topic, value, partition=0,
                     on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
    assert producer.flush(TIMEOUT) == 0 and delivered == [(None, 0)], delivered
    return leader


def test_a_controller_started_after_an_id_less_rewrite_names_the_topic_as_it_was(cluster):
    """Every broker stopped, an old tool rewrites a topic without its topic_id, and the first
    broker to start again becomes controller: neither it nor its metadata cache ever read
    the topic with its id. It names the topic with the id the controller recorded with the
    topic's partitions (znodes.py). Before: a new id, and both replicas' logs (the record
    below, acknowledged by both) were taken for an older topic's."""
    replicas = _live(cluster)[:2]
    cluster.zk.create(zn.topic_path("legacy3"), json.dumps(
        {"version": 1, "partitions": {"0": replicas}}).encode())
    named = wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy3"))[0])
                     .get("topic_id"), TIMEOUT, "legacy3 named by the controller")
    _produce_one(cluster, "legacy3", b"kept")
    assert zn.decode_partitions_node(cluster.zk.get(zn.partitions_path("legacy3"))[0]) \
        == named
    first = replicas[0]
    try:
        for broker in cluster.brokers.values():
            broker.stop()
        cluster.zk.set(zn.topic_path("legacy3"), json.dumps(
            {"version": 1, "partitions": {"0": replicas}}).encode())
        cluster.brokers[first].start()
        wait_for(lambda: cluster.zk.exists(zn.CONTROLLER) and _controller(cluster) == first,
                 TIMEOUT, f"broker {first} controller")
        again = wait_for(lambda: json.loads(cluster.zk.get(zn.topic_path("legacy3"))[0])
                         .get("topic_id"), TIMEOUT, "legacy3 named by the new controller")
        assert again == named
    finally:
        for broker in cluster.brokers.values():
            if not broker.alive:
                broker.start()
    wait_for(lambda: len(_state(cluster, "legacy3", 0)["isr"]) == 2, TIMEOUT,
             "legacy3-0's ISR whole again")
    assert _watermarks(cluster, _state(cluster, "legacy3", 0)["leader"], "legacy3") == (0, 1)
    for i in replicas:
        assert not list(cluster.brokers[i].data_dir.glob("legacy3-0.*-stray"))


def test_a_topic_id_changed_without_a_deletion_sets_the_replicas_aside(cluster):
    """A topic's id changes without the topic being deleted first (what a controller naming
    it wrongly, or a tool, would write): each replica sets its log aside as
    "<topic>-0.<unique>-stray", whole, and says so; the topic starts empty under the new id.
    Before: each replica deleted its log (the record acknowledged by both, gone)."""
    replicas = _live(cluster)[:2]
    cluster.zk.create(zn.topic_path("renamed"), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAQ", {0: tuple(replicas)}, {}, {}).encode())
    _produce_one(cluster, "renamed", b"set aside, not lost")
    version = cluster.zk.get(zn.topic_path("renamed"))[1].version
    cluster.zk.set(zn.topic_path("renamed"), zn.TopicAssignment(
        "AAAAAAAAAAAAAAAAAAAAAg", {0: tuple(replicas)}, {}, {}).encode(), version=version)
    for i in replicas:
        broker = cluster.brokers[i]
        wait_for(lambda b=broker: "kept for an operator" in b.log_text(), TIMEOUT,
                 f"broker {i}'s replica set aside")  # logged once renamed
        aside = list(broker.data_dir.glob("renamed-0.*-stray"))
        assert len(aside) == 1
        logs = list(aside[0].glob("*.log"))
        assert logs and b"set aside, not lost" in logs[0].read_bytes()
    leader = _state(cluster, "renamed", 0)["leader"]  # the state stayed as it was

    def led_anew():  # the new replica leads once its broker applied the state to it
        from confluent_kafka import KafkaException
        try:
            return _watermarks(cluster, leader, "renamed")
        except KafkaException:  # NOT_LEADER_OR_FOLLOWER until then
            return None

    assert wait_for(led_anew, TIMEOUT, "renamed-0 led under its new id") == (0, 0)


def test_deleting_a_topic_whose_assignment_is_not_whole(cluster):
    """DeleteTopics of a topic whose assignment's bytes were read but are not Kafka's
    whole JSON completes (before: the request stayed for good); one whose assignment the
    controller may not read waits, said once, and completes once it can be read."""
    from kazoo.security import OPEN_ACL_UNSAFE

    replicas = _live(cluster)[:2]
    for name in ("corrupt", "locked"):
        cluster.zk.create(zn.topic_path(name), zn.TopicAssignment(
            "AAAAAAAAAAAAAAAAAAAAAA", {0: tuple(replicas)}, {}, {}).encode())
        wait_for(lambda n=name: cluster.zk.exists(zn.partition_state_path(n, 0)), TIMEOUT,
                 f"{name}-0 led")
    cluster.zk.set(zn.topic_path("corrupt"), b"\xff not json")
    cluster.zk.add_auth("digest", "someone-else:secret")  # ADMIN on it, to lift its ACL
    cluster.zk.set_acls(zn.topic_path("locked"),
                        [make_digest_acl("someone-else", "secret", all=True)])
    for name in ("corrupt", "locked"):
        cluster.zk.create(zn.delete_topic_path(name), b"", makepath=True)
    wait_for(lambda: cluster.zk.exists(zn.topic_path("corrupt")) is None
             and cluster.zk.exists(zn.delete_topic_path("corrupt")) is None, TIMEOUT,
             "corrupt deleted")
    controller = cluster.brokers[_controller(cluster)]
    wait_for(lambda: "deleting topic locked waits" in controller.log_text(), TIMEOUT,
             "the wait said")
    passes = controller.log_text().count("deleting topic locked waits")
    cluster.zk.set_acls(zn.topic_path("locked"), OPEN_ACL_UNSAFE)
    wait_for(lambda: cluster.zk.exists(zn.topic_path("locked")) is None, TIMEOUT,
             "locked deleted once readable")
    assert passes == 1 == controller.log_text().count("deleting topic locked waits")
