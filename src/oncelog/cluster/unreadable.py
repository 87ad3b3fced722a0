"""A znode that cannot be read through its own fault, told apart from ZooKeeper being away.

Reading Kafka's topic znodes, three outcomes are not the answer wanted:

| what the read met                                | means                   | the reader        |
|--------------------------------------------------|-------------------------|-------------------|
| NoNode                                           | absent                  | as absent         |
| NoAuth (an ACL refusing this broker), or bytes   | that znode unreadable   | keeps what it last|
| that are not Kafka's JSON (hand-written, corrupt;| (``Unreadable``): that  | read of it, takes |
| an assignment without partitions or a well-formed| topic or partition only | no decision on it,|
| topic_id, or with a partition whose replicas are |                         | reads it again    |
| not distinct broker ids, which would make brokers|                         | next time, says   |
| delete logs)                                     |                         | it once           |
|                                                  |                         | (``Unreadables``) |
| anything else: the connection lost, the session  | ZooKeeper is away: the  | the whole read    |
| expired, no answer in time, a server error       | whole read fails        | raises, retried   |

One topic's unreadable znode used to fail every read it was part of: the controller's pass
(no leader elected for any topic), ElectLeaders, each broker's metadata cache (no topic
change reached Metadata) and replica watch. What a reader keeps of it survives a reset of its
picture (a reconnection); a broker bounced meanwhile stays counted dead for a skipped
partition until a decision on it lands (leader_election.py's *live*, X1).

An assignment whole but for a missing topic_id (pre-2.8 tooling) is unreadable to every
broker until the controller names it (leader_election.py T1). A deletion asked for a topic
whose assignment's bytes were read, whole or not, goes ahead (unwhole_topics.py); one the
controller may not read (a NoAuth) waits, said once.

A limitation, left as it is: the readers do not all share one ACL. If the controller cannot
read a state znode but a bounced broker it names as leader can (an ACL per broker), that
broker takes the leadership at the state's epoch (isr.py B4), perhaps over a wiped log,
while X1 means no controller pass moves it away or takes it out of the ISR until the
controller can read that state again. Give every broker the same ACL on Kafka's znodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from kazoo.exceptions import NoAuthError

T = TypeVar("T")

# what a decoder of Kafka's JSON raises on bytes that are not it (UnicodeDecodeError and
# JSONDecodeError are ValueErrors; a list where an object is wanted is an AttributeError;
# deep nesting a RecursionError)
_DECODE_ERRORS = (ValueError, KeyError, TypeError, AttributeError, RecursionError)


class Unreadable(Exception):
    """This znode cannot be read, through its own fault (the message says why)."""


def answer(got: object) -> Any:
    """One pipelined read's answer (batches.gather's: a value or an exception): the value;
    ``Unreadable`` for a NoAuth; any other exception raised as it is (NoNode included: the
    caller reads it as absence first)."""
    if isinstance(got, NoAuthError):
        raise Unreadable("NoAuth: its ACL refuses this broker") from None
    if isinstance(got, Exception):
        raise got
    return got


def decoded(decode: Callable[[bytes], T], data: bytes) -> T:
    try:
        return decode(data)
    except _DECODE_ERRORS as exc:
        raise Unreadable(f"not Kafka's JSON: {exc!r}"[:300]) from None


def unreadable(error: BaseException) -> Unreadable | None:
    """``error`` as an Unreadable when it is the znode's own fault (store.op raised it)."""
    if isinstance(error, Unreadable):
        return error
    if isinstance(error, NoAuthError):
        return Unreadable("NoAuth: its ACL refuses this broker")
    return None


def describe(key: Hashable) -> str:
    if isinstance(key, tuple) and isinstance(key[1], int):
        topic, partition = key[0], key[1]
        return f"the state of partition {topic}-{partition}"
    if isinstance(key, tuple):
        return f"the {key[1]} of topic {key[0]}"
    return f"topic {key}"


def topic_of(key: Hashable) -> str:
    return key[0] if isinstance(key, tuple) else key  # type: ignore[return-value]


class Told:
    """What one reader has said about unreadable znodes: each key (a topic name, or a
    (topic, partition) state) logged when it becomes unreadable or its reason changes, and
    when it is readable again; never at every read."""

    def __init__(self, reader: str, logger: logging.Logger) -> None:
        self.reader = reader
        self.log = logger
        self._said: dict[Hashable, str] = {}

    def now(self, problems: dict[Hashable, str]) -> None:
        """Every unreadable key as the reader's picture holds them now."""
        for key, why in problems.items():
            if self._said.get(key) != why:
                self.log.warning("%s: %s cannot be read from ZooKeeper (%s); left as last "
                                 "read, no decision taken on it, read again at each pass",
                                 self.reader, describe(key), why)
        for key in self._said.keys() - problems.keys():
            self.log.info("%s: %s can be read from ZooKeeper again", self.reader,
                          describe(key))
        self._said = dict(problems)


class Unreadables:
    """One reader's znodes that cannot be read through their own fault, by key (a topic
    name; (topic, partition) for a state; (topic, "config") and the like for one znode of a
    topic): the reader keeps what it last read of them, reads them again at each of its
    reads (an ACL change fires no watch) and says so once per change (``Told``)."""

    def __init__(self, reader: str, logger: logging.Logger) -> None:
        self.why: dict[Hashable, str] = {}
        self._told = Told(reader, logger)

    def failed(self, key: Hashable, why: object) -> None:
        self.why[key] = str(why)

    def read(self, key: Hashable) -> None:
        self.why.pop(key, None)

    def forget(self, topic: str) -> None:
        for key in [k for k in self.why if topic_of(k) == topic]:
            del self.why[key]

    def again(self, mark: Callable[[Hashable], None]) -> None:
        """After a read: each key marked to be read at the next, and said when changed."""
        for key in self.why:
            mark(key)
        self._told.now(self.why)
