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

import json
import time
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

    def encode(self) -> bytes:
        value = {
            "features": {},
            "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"},
            "endpoints": [f"PLAINTEXT://{self.host}:{self.port}"],
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
        for endpoint in value.get("endpoints", ()):
            scheme, _, address = endpoint.partition("://")
            if scheme == "PLAINTEXT":
                host, _, port_text = address.rpartition(":")
                port = int(port_text)
                break
        return cls(broker_id, str(host), int(port), value.get("rack"))


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
