"""The topic assignment and partition state znodes round-trip through Kafka's JSON."""

import json

from hypothesis import given
from hypothesis import strategies as st

from oncelog.cluster import znodes as zn

replicas = st.lists(st.integers(0, 1000), min_size=1, max_size=5, unique=True).map(tuple)
assignments = st.dictionaries(st.integers(0, 50), replicas, max_size=6)


@given(assignments.filter(bool), assignments, assignments)  # a topic has partitions
def test_topic_assignment_round_trips(partitions, adding, removing):
    value = zn.TopicAssignment("AAAAAAAAAAAAAAAAAAAAAA", partitions, adding, removing)
    assert zn.TopicAssignment.decode(value.encode()) == value


@given(st.integers(-1, 1000), st.integers(0, 2**31 - 1), replicas, st.integers(0, 2**31 - 1))
def test_partition_state_round_trips(leader, leader_epoch, isr, controller_epoch):
    state = zn.PartitionState(leader, leader_epoch, isr, controller_epoch)
    assert zn.PartitionState.decode(state.encode()) == state


def test_partition_state_reads_kafkas_json():
    kafka = b'{"controller_epoch":3,"leader":2,"version":1,"leader_epoch":7,"isr":[2,1]}'
    assert zn.PartitionState.decode(kafka) == zn.PartitionState(2, 7, (2, 1), 3)
    assert json.loads(zn.PartitionState(2, 7, (2, 1), 3).encode()) == json.loads(kafka)


def test_topic_config_round_trips():
    config = {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert zn.decode_topic_config(zn.encode_topic_config(config)) == config


def test_log_dir_event_and_offline_replicas():
    """Kafka's log directory event, byte for byte as its brokers write it (event 1: a log
    directory failure), and the offline replicas beside it, which round-trip."""
    assert json.loads(zn.encode_log_dir_event(3)) == {"version": 1, "broker": 3, "event": 1}
    offline = [("t", 0), ("__consumer_offsets", 17)]
    assert zn.decode_offline_replicas(zn.encode_offline_replicas(offline)) == set(offline)
    assert zn.decode_offline_replicas(b"{not json") == set()


def test_the_partitions_znode_records_the_topic_id_and_reads_anything_else_as_none():
    """What the controller records with a topic's partitions (T1's id when an old tool
    rewrote the assignment without one): Kafka's empty znode, JSON not ours, and an id that
    is not 16 bytes of url-safe base64 read as nothing recorded, never as an id."""
    topic_id = "dY7yyJxeQyWunDj4nS41tQ"
    assert zn.decode_partitions_node(zn.encode_partitions_node(topic_id)) == topic_id
    for data in (b"", None, b"\xff not json", b"[]", b'{"topic_id": 7}',
                 b'{"topic_id": "short"}', b'{"version": 1}'):
        assert zn.decode_partitions_node(data) is None, data
