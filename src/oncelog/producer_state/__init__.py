"""Every idempotence and transactional-partition decision, as a table (rules.py), the state it
keeps per producer (manager.py) and its snapshots (snapshot.py).

Must not know: I/O beyond its snapshot bytes (read and written through ``log/``), sockets, or
coordinators: a partition's producer state is rebuilt from its own log and snapshot alone.
"""
