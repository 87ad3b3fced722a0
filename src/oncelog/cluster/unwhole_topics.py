"""The controller's writes for a topic whose assignment znode it read but cannot use whole
(watched_topics.TopicRead's ``problem``, with the ``read_version`` of the bytes it got):
naming one that lacks only its topic_id (leader_election.py T1, with the id recorded with
its partitions when there is one), and a deletion asked for
one whose assignment is corrupt, id-less or without partitions. Both are conditional on the
version read and fenced by the controller epoch (membership.controller_transaction), as
the controller's other writes; a lost race is read again at the next pass.

A deletion of such a topic cannot trust the picture's partitions (it holds nothing, or what
was read before the bytes went bad): the ``partitions`` znode's children and their state
znodes are listed afresh, and the whole topic goes in one transaction (a partition made
meanwhile fails it: NotEmpty, read again)."""

from __future__ import annotations

from kazoo.exceptions import BadVersionError, NoAuthError, NoNodeError, NotEmptyError

from . import znodes as zn
from .batches import gather
from .watched_topics import TopicRead

LOST = (BadVersionError, NoNodeError, NotEmptyError)  # a concurrent change: read again


def recorded_topic_id(store, name: str) -> str | None:
    """The topic id the controller recorded with the topic's partitions (znodes.py), or
    None: no partitions yet, none recorded (made before it was), or unreadable (NoAuth)."""
    try:
        data, _ = store.op(store.client.get_async, zn.partitions_path(name))
    except (NoNodeError, NoAuthError):
        return None
    return zn.decode_partitions_node(data)


def write_topic_id(member, topic: TopicRead, topic_id: str) -> zn.TopicAssignment:
    """T1: the unnamed assignment with ``topic_id``, written at the version read (raises
    one of LOST when it changed meanwhile, ControllerMoved when deposed)."""
    unnamed = topic.unnamed
    assert unnamed is not None and topic.read_version is not None
    named = zn.TopicAssignment(topic_id, unnamed.partitions, unnamed.adding_replicas,
                               unnamed.removing_replicas)
    member.controller_transaction(lambda txn: txn.set_data(
        zn.topic_path(topic.name), named.encode(), version=topic.read_version))
    return named


def delete(member, store, topic: TopicRead) -> None:
    """The topic's state, partition and assignment znodes (at the version read) and its
    deletion request, in one transaction (raises one of LOST on a concurrent change; a
    NoAuth listing its partitions as it is: the caller says the deletion waits)."""
    zk = store.client
    base = zn.partitions_path(topic.name)
    try:
        children = sorted(store.op(zk.get_children_async, base))
    except NoNodeError:
        children = None
    stats = gather(store, [lambda c=c: zk.exists_async(f"{base}/{c}/state")
                           for c in children or ()])
    for stat in stats:
        if isinstance(stat, Exception):
            raise stat

    def build(txn) -> None:
        for child, stat in zip(children or (), stats, strict=True):
            if stat is not None:
                txn.delete(f"{base}/{child}/state")
            txn.delete(f"{base}/{child}")
        if children is not None:
            txn.delete(base)
        txn.delete(zn.topic_path(topic.name), version=topic.read_version)
        txn.delete(zn.delete_topic_path(topic.name))

    member.controller_transaction(build)
