"""The broker: the server core, apart from the API handlers (``apis/``).

Owns: the asyncio server, connections and dispatch (server.py), the request budget, the broker
and topic configuration (config, dynamic_config, group_configs, kafka_broker_keys), a
``Partition`` (its Log + ProducerStateManager + long-poll waiters), topics and log directories
(topics, log_dirs, log_dir_moves, log_cleaner), bounded logging (log_limits), and the
operators' counters and metrics.

Must not know: Kafka's decisions, which live in ``producer_state/`` (idempotence, transactional
partitions) and ``coordinator/`` (groups, transactions, producer ids); nor the wire format of
any one API beyond dispatching it (that is ``apis/``).
"""
