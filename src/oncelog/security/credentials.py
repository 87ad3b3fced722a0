"""SCRAM credentials in the metadata store, where Kafka's ZooKeeper mode keeps them: the entry
``config/users/<user>`` holds ``{"version": 1, "config": {"SCRAM-SHA-256": "salt=...,
stored_key=...,server_key=...,iterations=..."}}``. The same interface is the local file store
on one broker and ZooKeeper in a cluster, so every broker of a cluster knows the same users.

Other keys of a user's config (Kafka keeps a user's quotas in the same entry) are kept as
they are: a change reads the entry and writes it back by compare-and-set.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from ..metadata.store import NO_VERSION, BadVersion, MetadataStore, race_attempts
from .scram import MECHANISMS, ScramCredential, ScramError

USERS = "config/users"


def _path(user: str) -> str:
    # Kafka's Sanitizer: an entity name is URL-encoded in its znode's name.
    return f"{USERS}/{urllib.parse.quote(user, safe='')}"


class ScramCredentials:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def _config(self, user: str) -> tuple[dict[str, Any], int]:
        value, version = self.store.get(_path(user))
        config = value.get("config", {}) if isinstance(value, dict) else {}
        return dict(config), version

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        text = self._config(user)[0].get(mechanism)
        if not isinstance(text, str):
            return None
        try:
            return ScramCredential.from_text(text)
        except ScramError:
            return None

    def mechanisms(self, user: str) -> dict[str, int]:
        """mechanism -> iterations of each credential the user has."""
        found = {}
        for mechanism in MECHANISMS:
            credential = self.get(user, mechanism)
            if credential is not None:
                found[mechanism] = credential.iterations
        return found

    def users(self) -> list[str]:
        """The users with at least one SCRAM credential."""
        names = [urllib.parse.unquote(child) for child in self.store.children(USERS)]
        return sorted(name for name in names if self.mechanisms(name))

    def put(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        self._change(user, lambda config: config.__setitem__(mechanism, credential.to_text()))

    def delete(self, user: str, mechanism: str) -> bool:
        """False when the user had no credential for ``mechanism``."""
        found = []
        self._change(user, lambda config: found.append(config.pop(mechanism, None)))
        return found[-1] is not None

    def _change(self, user: str, change) -> None:
        for _ in race_attempts(f"change {_path(user)}"):
            config, version = self._config(user)
            change(config)
            try:
                if config:
                    self.store.compare_and_set(_path(user), {"version": 1, "config": config},
                                               version)
                elif version != NO_VERSION:
                    self.store.delete(_path(user), version)
                return
            except BadVersion:
                continue
