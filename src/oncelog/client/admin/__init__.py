"""The admin client, one module per family of Kafka's admin APIs.

Owns: ``base.py`` (``AdminBase``: the connections, the metadata, where a request goes: a
partition's leader, every broker, a coordinator followed while it moves), one module per
family, each a class ``<Family>Admin(AdminBase)`` with that family's methods and beside it
the types they return and the requests they build: ``topics.py`` (topics, partitions,
elections, reassignments), ``records.py`` (ListOffsets, DeleteRecords, DescribeProducers),
``configs.py`` (DescribeConfigs, AlterConfigs, IncrementalAlterConfigs; their types in
``admin_configs.py``), ``groups.py``, ``transactions.py`` (KIP-664 and KIP-939's), and
``cluster.py`` (the cluster and storage views); ``admin.py`` composes them into
``oncelog.Admin`` and re-exports every public name.

Adding a family (ACLs, SCRAM users, client quotas...): a new module here with a class
``<Family>Admin(AdminBase)`` (methods, result types, requests), and one line in the bases of
``Admin`` in ``admin.py`` (bases and imports in the order of the modules' names, so that
families added at the same time merge cleanly); add its result types to ``admin.py``'s
imports and ``__all__`` where callers import them from there. A family uses only
``AdminBase``'s methods, never another family's (tests/client/test_admin_families.py holds
both).

Must not know: the producer's or consumer's state; it reuses their protocol pieces only.
"""
