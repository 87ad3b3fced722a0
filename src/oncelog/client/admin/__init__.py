"""The admin client: ``Admin`` (admin.py: topics, partitions, configs, groups, transactions,
records, the cluster views) and the config request types (admin_configs.py).

Must not know: the producer's or consumer's state; it reuses their protocol pieces only.
"""
