"""Kafka's replication metrics for ``/metrics`` (cluster mode only), under the names the
Prometheus JMX exporter gives Kafka's MBeans (its example Kafka rules: a ``Value`` gauge is
``kafka_<domain>_<type>_<name>`` in lower case, a ``...PerSec`` meter's ``Count`` is the
counter ``kafka_<domain>_<type>_<name without PerSec>_total``), so an operator's Kafka
dashboards and alerts read them unchanged:

| series (``kafka_server_`` / ``kafka_controller_`` left out) | Kafka's MBean (name)          |
|-------------------------------------------------------------|-------------------------------|
| replicamanager_partitioncount                               | ReplicaManager PartitionCount |
| replicamanager_leadercount                                  | ReplicaManager LeaderCount    |
| replicamanager_underreplicatedpartitions                    | UnderReplicatedPartitions     |
| replicamanager_underminisrpartitioncount                    | UnderMinIsrPartitionCount     |
| replicamanager_atminisrpartitioncount                       | AtMinIsrPartitionCount        |
| replicamanager_isrshrinks_total                             | IsrShrinksPerSec (its Count)  |
| replicamanager_isrexpands_total                             | IsrExpandsPerSec (its Count)  |
| replicafetchermanager_maxlag{clientid="Replica"}            | ReplicaFetcherManager MaxLag  |
| kafkacontroller_activecontrollercount (controller)          | ActiveControllerCount         |
| kafkacontroller_offlinepartitionscount (controller)         | OfflinePartitionsCount        |

As in Kafka, the per-replica gauges count the partitions this broker leads (an ISR shorter
than the replica list is under-replicated; min.insync.replicas is the topic's), and the
controller's gauges are non-zero only on the controller (the offline partitions: a state
written with no leader, from its ZooKeeper-fed picture). The ISR counters count every change
of the ISR of a partition this broker leads, at one leader epoch: its own writes (a follower
fell behind or caught up) and the controller's (a dead or stopping follower taken out), as
Kafka's documentation has operators expect when a broker goes down. The fetcher's lag is
Kafka's: the leader's high watermark at the last answer minus our log end, the largest over
every partition followed.

A scrape reads each replica once and the picture's partitions once: linear in the number of
partitions, nothing on the produce path.
"""

from __future__ import annotations


def _gauge(name: str, text: str, value: int, labels: str = "") -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge", f"{name}{labels} {value}"]


def _counter(name: str, text: str, value: int) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} counter", f"{name} {value}"]


def lines(broker) -> list[str]:
    manager = broker.replicas
    if manager is None:  # one broker alone: no replication to report
        return []
    partitions = leaders = under = under_min = at_min = 0
    for partition in list(manager._replicated()):
        r = partition.replication
        partitions += 1
        if r is None or not r.is_leader:
            continue
        leaders += 1
        isr = len(r.isr)
        under += isr < len(r.replicas)
        under_min += isr < r.min_insync
        at_min += isr == r.min_insync
    member = broker.cluster
    controller = int(member.is_controller)
    offline = 0
    if controller:
        image = broker.cluster_mode.cache.image
        offline = sum(1 for topic in list(image.topics.values())
                      for p in topic.partitions if p.state is not None and p.leader < 0)
    prefix = "kafka_server_replicamanager_"
    return [
        *_gauge(prefix + "partitioncount", "Replicas held by this broker.", partitions),
        *_gauge(prefix + "leadercount", "Partitions this broker leads.", leaders),
        *_gauge(prefix + "underreplicatedpartitions",
                "Partitions this broker leads whose ISR is shorter than their replicas.", under),
        *_gauge(prefix + "underminisrpartitioncount",
                "Partitions this broker leads whose ISR is below min.insync.replicas.",
                under_min),
        *_gauge(prefix + "atminisrpartitioncount",
                "Partitions this broker leads whose ISR is at min.insync.replicas.", at_min),
        *_counter(prefix + "isrshrinks_total",
                  "ISR shrinks of partitions this broker leads.", manager.isr_shrinks),
        *_counter(prefix + "isrexpands_total",
                  "ISR expansions of partitions this broker leads.", manager.isr_expands),
        *_gauge("kafka_server_replicafetchermanager_maxlag",
                "The largest lag (leader's high watermark - our log end) over the "
                "partitions this broker follows.", manager.max_lag(), '{clientid="Replica"}'),
        *_gauge("kafka_controller_kafkacontroller_activecontrollercount",
                "1 on the controller, else 0.", controller),
        *_gauge("kafka_controller_kafkacontroller_offlinepartitionscount",
                "Partitions without a leader (on the controller, else 0).", offline),
        # Kafka's SessionExpireListener SessionState, a string there: a label here.
        *_gauge("kafka_server_sessionexpirelistener_sessionstate",
                "1 for the state of this broker's ZooKeeper session's connection.", 1,
                '{state="%s"}' % ("CONNECTED" if member.store.connected
                                  else "NOT_CONNECTED")),
    ]
