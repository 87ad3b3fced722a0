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

