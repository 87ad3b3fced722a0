"""The ``oncelog`` command: ``main`` (the parser and ``oncelog broker``) and one module per
command family: ``tools`` (topics, producers, stats, produce, consume, audit, scenario),
``cluster`` (cluster, log-dirs), ``groups``, ``transactions``, ``records``, ``configs``,
``spark`` and ``chaos``; ``table`` is the one table printer they share, ``errors`` the one
way a command stops on an error (exit status and message) and opens its admin client.

Must not know: how anything is decided. A command parses its arguments, calls the clients
(``oncelog.client``) or a package's entry point, and prints; logic that a test or another
caller would need belongs in that package.
"""
