"""Cluster mode: this broker's membership in a cluster coordinated by ZooKeeper.

Owns: registering the broker (``/brokers/ids/<broker.id>``, ephemeral), electing the controller
(``/controller``, ephemeral, with ``/controller_epoch`` raised by a conditional write), and
redoing both when the ZooKeeper session is lost, on its own thread beside the broker's event
loop. Kafka's znode layout and JSON are in znodes.py, the decisions in membership.py's tables.
What ZooKeeper assigns this broker's replicas, and the leader's ISR writes: replica_watch.py;
every replication decision, as tables: isr.py (the broker's replica manager acts on them).

The control plane too: where each partition's replicas go (placement.py), who leads it
(leader_election.py's table, written by controller.py fenced by the controller epoch), the
writes any broker makes for an admin request (topic_admin.py), and every broker's picture of
it all fed by ZooKeeper watches (metadata_cache.py).

Must not know: logs, producer state, the Kafka protocol or the broker's asyncio loop. It hands
out facts (who is registered, who is controller at which epoch, each partition's replicas,
leader and ISR, each replica's state) and decisions over plain numbers; what the broker does
with them is the broker's business. The ZooKeeper session itself is the metadata store's
(metadata/zookeeper.py). Without ``zookeeper.connect`` nothing here is imported.
"""


class ClusterStartError(Exception):
    """The broker cannot join its cluster (ZooKeeper unreachable, broker.id taken): it exits
    with CLUSTER_START_EXIT_CODE and this message instead of serving alone."""


CLUSTER_START_EXIT_CODE = 3
