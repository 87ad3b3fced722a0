"""TopicAdmin: the writes any broker makes for a client's admin request in cluster mode, as
Kafka's AdminZkClient makes them; the controller (controller.py) carries them out.

| request                      | written                                                    |
|------------------------------|------------------------------------------------------------|
| CreateTopics                 | ``/config/topics/<t>`` and ``/brokers/topics/<t>`` in one  |
|                              | transaction (the topic znode absent, else                  |
|                              | TOPIC_ALREADY_EXISTS); the controller writes each          |
|                              | partition's state                                          |
| DeleteTopics                 | ``/admin/delete_topics/<t>``; the controller removes the   |
|                              | topic's znodes                                             |
| CreatePartitions             | the assignment with the new partitions, at the version read|
| AlterPartitionReassignments  | the assignment with the partition's replicas = target +    |
|                              | original (target first), adding = target - original,       |
|                              | removing = original - target, at the version read; a       |
|                              | cancellation puts the original back; the controller        |
|                              | completes it (leader_election.py, A1)                      |
| AlterConfigs (a topic)       | ``/config/topics/<t>`` at the version read, then a change  |
|                              | notification ``/config/changes/config_change_<seq>``       |

Every write is conditional (a znode's absence or version): two brokers answering requests
about one topic at once cannot overwrite each other; the loser answers a retriable error.
"""

from __future__ import annotations

from . import znodes as zn
from .unreadable import decoded, unreadable


class TopicExists(Exception):
    pass


class TopicMissing(Exception):
    pass


class Conflict(Exception):
    """The znode changed between our read and our write: the client may retry."""


class TopicAdmin:
    def __init__(self, store) -> None:
        self.store = store
        self.zk = store.client

    def _op(self, call_async, *args, **kwargs):
        return self.store.op(call_async, *args, **kwargs)

    def ensure_paths(self) -> None:
        for path in (zn.BROKER_TOPICS, zn.CONFIG_TOPICS, zn.CONFIG_CHANGES, zn.DELETE_TOPICS,
                     zn.CONTROLLED_SHUTDOWN, zn.OFFLINE_REPLICAS,
                     zn.LOG_DIR_EVENT_NOTIFICATION):
            self._op(self.zk.ensure_path_async, path)

    def brokers_without_log_dirs(self) -> frozenset[int]:
        """The brokers whose report under /oncelog/offline_replicas says every log
        directory of theirs failed (placement.py leaves them out)."""
        from kazoo.exceptions import NoNodeError

        try:
            ids = self._op(self.zk.get_children_async, zn.OFFLINE_REPLICAS)
        except NoNodeError:
            return frozenset()
        pending = [(b, self.zk.get_async(f"{zn.OFFLINE_REPLICAS}/{b}")) for b in ids]
        found = set()
        for broker, answer in pending:  # one round trip for all of them
            try:
                data, _ = self._op(lambda a=answer: a)
            except NoNodeError:
                continue  # its broker restarted meanwhile: its directories are back
            if zn.decode_all_log_dirs_offline(data):
                found.add(int(broker))
        return frozenset(found)

    def assignment(self, topic: str) -> tuple[zn.TopicAssignment, int]:
        """The assignment and its znode version; TopicMissing; Unreadable when its znode
        cannot be read through its own fault (unreadable.py: that topic's error alone)."""
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self._op(self.zk.get_async, zn.topic_path(topic))
        except NoNodeError:
            raise TopicMissing(topic) from None
        except Exception as exc:
            if (bad := unreadable(exc)) is None:
                raise
            raise bad from None
        return decoded(zn.TopicAssignment.decode, data), stat.version

    def create_topic(self, topic: str, assignment: zn.TopicAssignment,
                     configs: dict[str, str]) -> None:
        from kazoo.exceptions import NodeExistsError

        config_path = zn.topic_config_path(topic)
        stat = self._op(self.zk.exists_async, config_path)  # left by an older topic
        txn = self.zk.transaction()
        if stat is None:
            txn.create(config_path, zn.encode_topic_config(configs))
        else:
            txn.set_data(config_path, zn.encode_topic_config(configs), version=stat.version)
        txn.create(zn.topic_path(topic), assignment.encode())
        results = self._op(txn.commit_async)
        if isinstance(results[1], NodeExistsError):
            raise TopicExists(topic)
        if any(isinstance(r, Exception) for r in results):
            raise Conflict(f"topic {topic!r}: its config znode changed meanwhile")

    def delete_topic(self, topic: str) -> None:
        """Marks it for deletion (already marked: nothing more to do)."""
        from kazoo.exceptions import NodeExistsError

        try:
            self._op(self.zk.create_async, zn.delete_topic_path(topic), b"")
        except NodeExistsError:
            pass

    def marked_for_deletion(self) -> set[str]:
        return set(self._op(self.zk.get_children_async, zn.DELETE_TOPICS))

    def set_assignment(self, topic: str, assignment: zn.TopicAssignment, version: int) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        try:
            self._op(self.zk.set_async, zn.topic_path(topic), assignment.encode(),
                     version=version)
        except NoNodeError:
            raise TopicMissing(topic) from None
        except BadVersionError:
            raise Conflict(f"topic {topic!r} changed meanwhile; try again") from None

    def alter_topic_config(self, topic: str, configs: dict[str, str]) -> None:
        from kazoo.exceptions import BadVersionError, NoNodeError

        if self._op(self.zk.exists_async, zn.topic_path(topic)) is None:
            raise TopicMissing(topic)
        path = zn.topic_config_path(topic)
        try:
            stat = self._op(self.zk.exists_async, path)
            if stat is None:
                self._op(self.zk.create_async, path, zn.encode_topic_config(configs))
            else:
                self._op(self.zk.set_async, path, zn.encode_topic_config(configs),
                         version=stat.version)
        except (BadVersionError, NoNodeError):
            raise Conflict(f"topic {topic!r}: its configs changed meanwhile") from None
        self._op(self.zk.create_async, f"{zn.CONFIG_CHANGES}/config_change_",
                 zn.encode_config_change(f"topics/{topic}"), sequence=True)


def reassigned(assignment: zn.TopicAssignment, partition: int,
               target: tuple[int, ...] | None) -> zn.TopicAssignment:
    """The assignment with a reassignment of ``partition`` to ``target`` begun (None: the
    ongoing one cancelled, its original replicas back)."""
    current = assignment.partitions[partition]
    adding = dict(assignment.adding_replicas)
    removing = dict(assignment.removing_replicas)
    original = tuple(b for b in current if b not in adding.get(partition, ()))
    partitions = dict(assignment.partitions)
    adding.pop(partition, None)
    removing.pop(partition, None)
    if target is None or tuple(target) == original:
        partitions[partition] = original
    else:
        partitions[partition] = tuple(target) + tuple(b for b in original if b not in target)
        if added := tuple(b for b in target if b not in original):
            adding[partition] = added
        if dropped := tuple(b for b in original if b not in target):
            removing[partition] = dropped
    return zn.TopicAssignment(assignment.topic_id, partitions, adding, removing)


def reassignment_target(assignment: zn.TopicAssignment, partition: int) -> tuple[int, ...] | None:
    """The target of an ongoing reassignment of ``partition``, None when there is none."""
    adding = assignment.adding_replicas.get(partition, ())
    removing = assignment.removing_replicas.get(partition, ())
    if not adding and not removing:
        return None
    return tuple(b for b in assignment.partitions[partition] if b not in removing)
