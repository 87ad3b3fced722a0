"""oncelog.Admin's config calls: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs,
a broker's own configs asked of that broker. What they take and return, and their requests,
are admin_configs.py's."""

from __future__ import annotations

from collections.abc import Iterable

from kio.schema.errors import ErrorCode

from ...protocol import api_versions as apis
from ...protocol.schema import build
from ..network.connection import BrokerConnection, KafkaError
from . import admin_configs
from .admin_configs import AlterConfigOp, ConfigEntry, ConfigResource
from .base import AdminBase, raise_for

RESOURCE_TOPIC = admin_configs.RESOURCE_TYPES["topic"]


class ConfigsAdmin(AdminBase):
    def describe_topic_configs(self, name: str) -> dict[str, tuple[str | None, bool]]:
        """config name -> (value, is_default)."""
        def make(mod, version):
            resource = build(mod.DescribeConfigsResource, resource_type=RESOURCE_TOPIC,
                             resource_name=name, configuration_keys=None)
            return build(mod.DescribeConfigsRequest, resources=(resource,),
                         include_synonyms=False, include_documentation=False)

        response = self.conn.call(apis.DESCRIBE_CONFIGS, make)
        result = {}
        for res in response.results:
            raise_for(res.error_code, res.error_message)
            for c in res.configs:
                is_default = getattr(c, "is_default", None)
                if is_default is None:
                    is_default = getattr(c, "config_source", 5) == 5
                result[c.name] = (c.value, bool(is_default))
        return result

    def describe_configs(self, resources: Iterable[ConfigResource],
                         keys: Iterable[str] | None = None, include_synonyms: bool = False,
                         include_documentation: bool = False
                         ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """Every config of each topic or broker (only ``keys`` when given): value, source,
        read_only, sensitive, and on request synonyms and documentation. A resource the broker
        refused raises KafkaError naming it."""
        result = {}
        for conn, group in self._config_brokers(list(resources)).items():
            response = conn.call(apis.DESCRIBE_CONFIGS, admin_configs.describe_request(
                group, keys, include_synonyms, include_documentation))
            for res in response.results:
                resource = admin_configs.resource_of(res)
                raise_for(res.error_code, f"{resource.type} {resource.name!r}: "
                                          f"{res.error_message or ''}")
                result[resource] = admin_configs.read_entries(res)
        return result

    def incremental_alter_configs(
            self, changes: dict[ConfigResource, list[AlterConfigOp]],
            validate_only: bool = False) -> dict[ConfigResource, KafkaError | None]:
        """Apply SET / DELETE / APPEND / SUBTRACT to each resource, all or nothing per
        resource: None where it was done, the KafkaError (INVALID_CONFIG naming the key, ...)
        where nothing changed."""
        return self._alter(changes, lambda group: admin_configs.incremental_request(
            {r: changes[r] for r in group}, validate_only), apis.INCREMENTAL_ALTER_CONFIGS)

    def alter_configs(self, configs: dict[ConfigResource, dict[str, str]],
                      validate_only: bool = False) -> dict[ConfigResource, KafkaError | None]:
        """AlterConfigs: each resource's overrides become exactly ``configs[resource]``
        (keys left out go back to their defaults); results as incremental_alter_configs."""
        return self._alter(configs, lambda group: admin_configs.alter_request(
            {r: configs[r] for r in group}, validate_only), apis.ALTER_CONFIGS)

    def _alter(self, resources, make_for, api_key: int
               ) -> dict[ConfigResource, KafkaError | None]:
        result: dict[ConfigResource, KafkaError | None] = {}
        for conn, group in self._config_brokers(list(resources)).items():
            response = conn.call(api_key, make_for(group))
            for res in response.responses:
                error, message = admin_configs.outcome(res)
                result[admin_configs.resource_of(res)] = \
                    None if error == ErrorCode.none else KafkaError(error, message)
        return result

    def _config_brokers(self, resources: list[ConfigResource]
                        ) -> dict[BrokerConnection, list[ConfigResource]]:
        """Where each resource is asked: a broker's own configs at that broker, the rest at
        any broker."""
        by_id = self._brokers_by_id() if any(
            r.type_id == admin_configs.RESOURCE_TYPES["broker"] and r.name
            for r in resources) else {}
        groups: dict[BrokerConnection, list[ConfigResource]] = {}
        for r in resources:
            conn = self.conn
            if r.type_id == admin_configs.RESOURCE_TYPES["broker"] and r.name:
                if not r.name.isdigit() or int(r.name) not in by_id:
                    raise KafkaError(ErrorCode.invalid_request,
                                     f"broker {r.name!r} is not in the cluster")
                conn = self._broker(*by_id[int(r.name)])
            groups.setdefault(conn, []).append(r)
        return groups
