"""The metadata store: versioned entries behind one interface (get with version,
compare-and-set, delete, children); the local file store is the embedded default.

Must not know: what the broker keeps in it (topics, configs, producer id blocks).
"""
