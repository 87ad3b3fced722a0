"""Build version-specific kio entities from one set of values.

kio generates a module per API version with the same class names; a field that a version
lacks is simply dropped, so each handler (broker) or call (client) is written once for all the
versions it supports.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from types import ModuleType
from typing import Any

from kio.index import load_payload_module
from kio.static.constants import EntityType


@functools.cache
def response_module(api_key: int, api_version: int) -> ModuleType:
    return load_payload_module(api_key, api_version, EntityType.response)


@functools.cache
def request_module(api_key: int, api_version: int) -> ModuleType:
    return load_payload_module(api_key, api_version, EntityType.request)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def build(cls: type, **values: Any) -> Any:
    names = _field_names(cls)
    if "error_message" in values and _is_response(cls):
        values["error_message"] = without_paths(values["error_message"])
    if names.issuperset(values):  # the usual case: no field this version lacks
        return cls(**values)
    return cls(**{k: v for k, v in values.items() if k in names})


@functools.cache
def _is_response(cls: type) -> bool:
    return cls.__module__.endswith(".response")


# An absolute path, as an OSError's text quotes it (quoted or not): what a server's files are
# called is none of a client's business, so no error message carries one.
_PATH = re.compile(r"""(?<![\w.~-])/[^\s'",;:()\[\]]*""")


def without_paths(message: str | None) -> str | None:
    """``message`` with every absolute path replaced by ``<path>``: every answer's
    error_message goes through here (``build`` for responses, and Produce's own encoder)."""
    if message is None or "/" not in message:
        return message
    return _PATH.sub("<path>", message)


def has_field(cls: type, name: str) -> bool:
    return name in _field_names(cls)
