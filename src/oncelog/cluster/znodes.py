"""Kafka's znodes for cluster membership, and their JSON (as Kafka 3.x's ZooKeeper mode
writes them, so tools that read a Kafka cluster's ZooKeeper read ours).

- ``/brokers/ids/<id>``: ephemeral, version 5 of the registration::

    {"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},
     "endpoints":["PLAINTEXT://host:port"],"jmx_port":-1,"port":port,"host":"host",
     "version":5,"timestamp":"<ms>"[,"rack":"<broker.rack>"]}

- ``/controller``: ephemeral, ``{"version":1,"brokerid":<id>,"timestamp":"<ms>"}``.
- ``/controller_epoch``: persistent, the epoch as a decimal string; 0 before the first
  controller, each new controller's write raising it by one.
- ``/cluster/id``: persistent, ``{"version":"1","id":"<cluster id>"}``.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
import uuid
from dataclasses import dataclass

BROKER_IDS = "/brokers/ids"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CLUSTER_ID = "/cluster/id"
INITIAL_CONTROLLER_EPOCH = 0
_REGISTRATION_VERSION = 5


def broker_path(broker_id: int) -> str:
    return f"{BROKER_IDS}/{broker_id}"


def _now_ms() -> str:
    return str(int(time.time() * 1000))


def _dumps(value: dict) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    host: str
    port: int
    rack: str | None = None
    # Every listener's advertised endpoint: (name, host, port, security protocol); empty:
    # one PLAINTEXT endpoint at host:port.
    endpoints: tuple[tuple[str, str, int, str], ...] = ()

    def endpoint(self, listener: str | None) -> tuple[str, int]:
        """Where a client of ``listener`` reaches this broker (host:port without one)."""
        for name, host, port, _ in self.endpoints:
            if name == listener:
                return host, port
        return self.host, self.port

    def encode(self) -> bytes:
        endpoints = self.endpoints or (("PLAINTEXT", self.host, self.port, "PLAINTEXT"),)
        value = {
            "features": {},
            "listener_security_protocol_map": {n: p for n, _, _, p in endpoints},
            "endpoints": [f"{n}://{h}:{p}" for n, h, p, _ in endpoints],
            "jmx_port": -1,
            "port": self.port,
            "host": self.host,
            "version": _REGISTRATION_VERSION,
            "timestamp": _now_ms(),
        }
        if self.rack is not None:
            value["rack"] = self.rack
        return _dumps(value)

    @classmethod
    def decode(cls, broker_id: int, data: bytes) -> BrokerRegistration:
        """From any registration version: the PLAINTEXT endpoint when there is one (version 2
        on), else host and port (version 1)."""
        value = json.loads(data)
        host, port = value.get("host"), value.get("port")
        protocols = value.get("listener_security_protocol_map") or {}
        endpoints = []
        for endpoint in value.get("endpoints", ()):
            scheme, _, address = endpoint.partition("://")
            at, _, port_text = address.rpartition(":")
            endpoints.append((scheme, at.strip("[]"), int(port_text),
                              protocols.get(scheme, scheme)))
            if scheme == "PLAINTEXT" and (host, port) == (value.get("host"), value.get("port")):
                host, port = at, int(port_text)
        return cls(broker_id, str(host), int(port), value.get("rack"), tuple(endpoints))


def encode_controller(broker_id: int) -> bytes:
    return _dumps({"version": 1, "brokerid": broker_id, "timestamp": _now_ms()})


def decode_controller(data: bytes) -> int:
    return int(json.loads(data)["brokerid"])


def encode_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_epoch(data: bytes) -> int:
    return int(data.decode())


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return str(json.loads(data)["id"])


# --- Topics and partition state: the seam between the controller (which writes them) and
# every broker's replica manager (which follows them). Kafka 3.x's ZooKeeper-mode JSON.
#
# - ``/brokers/topics/<topic>``: persistent, the replica assignment::
#
#     {"version":3,"topic_id":"<base64 uuid>","partitions":{"0":[1,2,3]},
#      "adding_replicas":{},"removing_replicas":{}}
#
# - ``/brokers/topics/<topic>/partitions/<p>/state``: persistent, changed only by conditional
#   writes (the znode version is the ``zk_version`` a writer must name)::
#
#     {"controller_epoch":1,"leader":1,"version":1,"leader_epoch":0,"isr":[1,2,3]}
#
#   ``leader`` is -1 when no replica may lead (no ISR member alive and unclean election off).
# - ``/admin/delete_topics/<topic>``: a deletion request the controller carries out.
# - ``/config/topics/<topic>``: ``{"version":1,"config":{"key":"value"}}``, and the change
#   notification ``/config/changes/config_change_<seq>`` = ``{"version":2,"entity_path":
#   "topics/<topic>"}`` every broker watches.

BROKER_TOPICS = "/brokers/topics"
DELETE_TOPICS = "/admin/delete_topics"
CONFIG_TOPICS = "/config/topics"
CONFIG_CHANGES = "/config/changes"
NO_LEADER = -1
_ASSIGNMENT_VERSION = 3
_STATE_VERSION = 1


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def partition_state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


@dataclass(frozen=True, slots=True)
class TopicAssignment:
    """Which brokers hold each partition of a topic, the first being the preferred leader."""

    topic_id: str
    partitions: dict[int, tuple[int, ...]]
    adding_replicas: dict[int, tuple[int, ...]]
    removing_replicas: dict[int, tuple[int, ...]]

    def encode(self) -> bytes:
        def lists(mapping: dict[int, tuple[int, ...]]) -> dict[str, list[int]]:
            return {str(p): list(replicas) for p, replicas in sorted(mapping.items())}

        return _dumps({"version": _ASSIGNMENT_VERSION, "topic_id": self.topic_id,
                       "partitions": lists(self.partitions),
                       "adding_replicas": lists(self.adding_replicas),
                       "removing_replicas": lists(self.removing_replicas)})

    @classmethod
    def decode(cls, data: bytes, unnamed: bool = False) -> TopicAssignment:
        """``unnamed``: one without a topic_id key (pre-2.8 tooling's version 1) decodes
        with topic_id "" (for the controller alone, which names it: leader_election.py T1)."""
        value = json.loads(data)

        def tuples(key: str) -> dict[int, tuple[int, ...]]:
            return {int(p): tuple(int(b) for b in replicas)
                    for p, replicas in (value.get(key) or {}).items()}

        # What the brokers act on must be whole: an assignment without partitions would
        # drop the topic on every broker, one without its id would make each broker take
        # it for a new topic; both delete local logs. Either is unreadable (unreadable.py).
        # A partition without replicas (or with a negative or repeated broker id) is
        # left out of every broker's view, which deletes its local logs: unreadable too.
        partitions = tuples("partitions")
        if not partitions:
            raise ValueError("an assignment without partitions")
        for p, replicas in partitions.items():
            if not replicas or min(replicas) < 0 or len(set(replicas)) != len(replicas):
                raise ValueError(f"partition {p}'s replicas {list(replicas)[:10]} are not "
                                 f"distinct broker ids")
        topic_id = value.get("topic_id")
        if unnamed and "topic_id" not in value:
            topic_id = ""
        elif not isinstance(topic_id, str):
            raise ValueError("an assignment without a topic_id")
        else:
            decode_topic_id(topic_id)
        return cls(topic_id, partitions, tuples("adding_replicas"),
                   tuples("removing_replicas"))


def decode_topic_id(text: str) -> uuid.UUID:
    """Kafka's topic id: 16 bytes in url-safe base64 without padding (ValueError else)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"a topic_id that is not base64: {text[:40]!r}") from exc
    if len(raw) != 16:
        raise ValueError(f"a topic_id that is not 16 bytes: {text[:40]!r}")
    return uuid.UUID(bytes=raw)


# What a leadership handover was asked for (leader_election.py's H rows): a preferred
# election (ElectLeaders, the auto rebalance) or a reassignment's completion (A1).
HANDOVER_PREFERRED = "preferred"
HANDOVER_REASSIGNMENT = "reassignment"
_HANDOVERS = (HANDOVER_PREFERRED, HANDOVER_REASSIGNMENT)


@dataclass(frozen=True, slots=True)
class PartitionState:
    """Leader, leader epoch and ISR of one partition, as the controller (or, for ISR changes,
    the leader) last wrote them.

    ``handover_for``/``handover_ready`` are not Kafka's (its tools ignore a key they do not
    know): the controller asks the live leader to hand its leadership over before it moves
    it (``"oncelog_handover": {"for": ..., "ready": false}``), and the leader says ``ready``
    once its ISR holds every record it acknowledged (isr.py's rows H7-H9)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    handover_for: str = ""  # "": none asked
    handover_ready: bool = False

    def encode(self) -> bytes:
        value = {"controller_epoch": self.controller_epoch, "leader": self.leader,
                 "version": _STATE_VERSION, "leader_epoch": self.leader_epoch,
                 "isr": list(self.isr)}
        if self.handover_for:
            value["oncelog_handover"] = {"for": self.handover_for,
                                         "ready": self.handover_ready}
        return _dumps(value)

    @classmethod
    def decode(cls, data: bytes) -> PartitionState:
        value = json.loads(data)
        handover = value.get("oncelog_handover")
        asked = handover.get("for") if isinstance(handover, dict) else None
        return cls(int(value["leader"]), int(value["leader_epoch"]),
                   tuple(int(b) for b in value["isr"]), int(value["controller_epoch"]),
                   asked if asked in _HANDOVERS else "",
                   asked in _HANDOVERS and handover.get("ready") is True)

    def without_handover(self, controller_epoch: int) -> PartitionState:
        return PartitionState(self.leader, self.leader_epoch, self.isr, controller_epoch)


def encode_topic_config(config: dict[str, str]) -> bytes:
    return _dumps({"version": 1, "config": dict(sorted(config.items()))})


def decode_topic_config(data: bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in json.loads(data).get("config", {}).items()}


def encode_config_change(entity_path: str) -> bytes:
    return _dumps({"version": 2, "entity_path": entity_path})


def decode_config_change(data: bytes) -> str:
    """The entity path (``topics/<topic>``) a change notification names."""
    return str(json.loads(data).get("entity_path", ""))


def partitions_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions"


# Not Kafka's (its ``partitions`` znode holds no data; its tools neither read nor write it):
# the controller creates it with the topic id its first states were written under. Pre-2.8
# tooling rewrites the assignment znode without the id, and a controller naming it again
# (leader_election.py T1) must use the id the replicas' logs carry even when no broker
# read the topic whole before (a controller started after the rewrite), or every replica
# would take it for a new topic.
def encode_partitions_node(topic_id: str) -> bytes:
    return _dumps({"version": 1, "topic_id": topic_id})


def decode_partitions_node(data: bytes | None) -> str | None:
    """The topic id recorded, or None: Kafka's empty znode, or bytes that are not ours."""
    try:
        value = json.loads(data or b"null")
    except ValueError:
        return None
    topic_id = value.get("topic_id") if isinstance(value, dict) else None
    if not isinstance(topic_id, str):
        return None
    try:
        decode_topic_id(topic_id)
    except ValueError:
        return None
    return topic_id


def delete_topic_path(topic: str) -> str:
    return f"{DELETE_TOPICS}/{topic}"


def topic_config_path(topic: str) -> str:
    return f"{CONFIG_TOPICS}/{topic}"


# Not Kafka's (its brokers ask the controller with the ControlledShutdown request, which
# Kafka 4's protocol no longer has): a broker stopping creates this ephemeral znode and the
# controller moves its leaderships away (cluster/controller.py); the znode goes with the
# broker's session, so a broker that dies meanwhile leaves nothing behind. The controller
# writes CONTROLLED_SHUTDOWN_MOVED into it once a pass has landed every move it decided
# (the broker need not read every partition's state to know it may stop).
CONTROLLED_SHUTDOWN = "/oncelog/controlled_shutdown"
CONTROLLED_SHUTDOWN_MOVED = b"moved"

# Kafka's: a broker whose log directory failed creates a sequential
# ``log_dir_event_<seq>`` here with ``{"version":1,"broker":<id>,"event":1}`` (1: a log
# directory failure); the controller reads which replicas went offline and deletes it.
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
# Kafka's: a leader that changed ISRs creates a sequential ``isr_change_<seq>`` here naming
# them; Kafka's controller reads and deletes them. Ours reads the state znodes themselves
# (watched), so it only deletes them (controller.py).
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
LOG_DIR_EVENT_PREFIX = "log_dir_event_"
LOG_DIR_FAILURE_EVENT = 1
# Not Kafka's (its controller asks the broker with LeaderAndIsr which replicas are offline):
# the broker writes them here, ``{"version":1,"partitions":[{"topic":..,"partition":..}]}``,
# with ``"all_log_dirs_offline":true`` once every log directory of the broker failed (new
# replicas are not placed there: placement.py), persistent (a session expiring does not
# bring a failed directory back; the broker's next start, which recovers it, writes it
# again).
OFFLINE_REPLICAS = "/oncelog/offline_replicas"


def encode_log_dir_event(broker_id: int) -> bytes:
    return _dumps({"version": 1, "broker": broker_id, "event": LOG_DIR_FAILURE_EVENT})


def encode_offline_replicas(partitions: list[tuple[str, int]],
                            all_log_dirs_offline: bool = False) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p}
                                                for t, p in partitions],
                   **({"all_log_dirs_offline": True} if all_log_dirs_offline else {})})


def decode_all_log_dirs_offline(data: bytes) -> bool:
    """Whether the broker's report says every one of its log directories failed."""
    try:
        return json.loads(data).get("all_log_dirs_offline") is True
    except (ValueError, AttributeError):
        return False


def decode_offline_replicas(data: bytes) -> set[tuple[str, int]]:
    """The replicas a broker reported offline; nothing for what does not parse (a write of
    another version: the broker writes it again at its next failure or start)."""
    try:
        return {(str(e["topic"]), int(e["partition"]))
                for e in json.loads(data)["partitions"]}
    except (ValueError, KeyError, TypeError):
        return set()
