"""Fault injection: a Kafka-aware proxy (proxy.py, its rules in rules.py) and the seeds'
scenarios run against a live broker (scenarios.py, txn_scenarios.py; what a run records in
outcome.py, drawn by diagram.py).

Must not know: the broker's code: everything here speaks the Kafka protocol through
``oncelog.client``, so it runs against any Kafka broker.
"""
