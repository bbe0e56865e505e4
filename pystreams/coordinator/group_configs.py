"""Dynamic group configs (KIP-848 "Group Configurations"): DescribeConfigs and
IncrementalAlterConfigs on GROUP resources, kept as GroupConfig records.

The overrides live in the shard context (``ctx.group_configs``), where every manager reads them
through ``ctx.group_config(group_id, name)``.
"""

from __future__ import annotations

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.config import (
    GROUP_CONFIG_NAMES,
    HEARTBEAT_INTERVAL,
    MIGRATION_POLICY,
    SESSION_TIMEOUT,
    parse_int,
    validate_group_config,
)
from pystreams.coordinator.context import ShardContext
from pystreams.protocol import messages as m

GROUP_RESOURCE = 16  # ConfigResource.Type.GROUP
CONFIG_SOURCE_DEFAULT = 5
CONFIG_SOURCE_GROUP = 8
OP_SET, OP_DELETE = 0, 1
_ONLY_GROUPS = "The pystreams coordinator serves GROUP (16) config resources only."


class GroupConfigManager:
    def __init__(self, ctx: ShardContext) -> None:
        self.ctx = ctx

    # --- records ----------------------------------------------------------------------------

    def replay(self, record: r.GroupConfig) -> None:
        if record.value is None:
            self.ctx.group_configs.pop(record.group_id, None)
        else:
            self.ctx.group_configs[record.group_id] = dict(record.value.configs)

    def pre_image(self, record: r.GroupConfig) -> r.GroupConfig:
        held = self.ctx.group_configs.get(record.group_id)
        return r.GroupConfig(record.group_id, r.GroupConfigValue(dict(held)) if held is not None else None)

    # --- DescribeConfigs --------------------------------------------------------------------

    def describe_configs(self, request, now_ms: int):
        Response = m.DescribeConfigsResponse
        Result, Entry = Response.DescribeConfigsResult, Response.DescribeConfigsResult.DescribeConfigsResourceResult
        results = []
        for resource in request.resources:
            if resource.resource_type != GROUP_RESOURCE:
                results.append(
                    Result(
                        error_code=Errors.InvalidRequestError.errno,
                        error_message=_ONLY_GROUPS,
                        resource_type=resource.resource_type,
                        resource_name=resource.resource_name,
                        configs=[],
                    )
                )
                continue
            overrides = self.ctx.group_configs.get(resource.resource_name, {})
            names = resource.configuration_keys or list(GROUP_CONFIG_NAMES)
            entries = []
            for name in names:
                if name not in GROUP_CONFIG_NAMES:
                    continue
                override = overrides.get(name)
                entries.append(
                    Entry(
                        name=name,
                        value=override if override is not None else self.ctx.config.default_text(name),
                        read_only=False,
                        is_default=override is None,
                        config_source=CONFIG_SOURCE_GROUP if override is not None else CONFIG_SOURCE_DEFAULT,
                        is_sensitive=False,
                        synonyms=[],
                        config_type=2 if name == MIGRATION_POLICY else 3,  # STRING, INT
                        documentation=None,
                    )
                )
            results.append(Result(error_code=0, error_message=None, resource_type=GROUP_RESOURCE, resource_name=resource.resource_name, configs=entries))
        return Response(results=results)

    # --- IncrementalAlterConfigs ------------------------------------------------------------

    def incremental_alter_configs(self, request, now_ms: int):
        Response = m.IncrementalAlterConfigsResponse
        Result = Response.AlterConfigsResourceResponse
        results = []
        for resource in request.resources:

            def result(code=0, message=None, resource=resource):
                return Result(error_code=code, error_message=message, resource_type=resource.resource_type, resource_name=resource.resource_name)

            if resource.resource_type != GROUP_RESOURCE:
                results.append(result(Errors.InvalidRequestError.errno, _ONLY_GROUPS))
                continue
            if not resource.resource_name:
                results.append(result(Errors.InvalidRequestError.errno, "The group id (resource name) must be non-empty."))
                continue
            held = self.ctx.group_configs.get(resource.resource_name, {})
            configs = dict(held)
            try:
                for entry in resource.configs:
                    if entry.config_operation == OP_SET:
                        configs[entry.name] = str(validate_group_config(self.ctx.config, entry.name, entry.value))
                    elif entry.config_operation == OP_DELETE:
                        if entry.name not in GROUP_CONFIG_NAMES:
                            raise ValueError(f"unknown group config {entry.name!r}")
                        configs.pop(entry.name, None)
                    else:
                        raise ValueError(f"operation {entry.config_operation} is not supported for {entry.name}: group configs are not lists")
                session = parse_int(configs.get(SESSION_TIMEOUT, self.ctx.config.session_timeout_ms), SESSION_TIMEOUT)
                interval = parse_int(configs.get(HEARTBEAT_INTERVAL, self.ctx.config.heartbeat_interval_ms), HEARTBEAT_INTERVAL)
                if interval >= session:
                    raise ValueError(f"{HEARTBEAT_INTERVAL}={interval} must be smaller than {SESSION_TIMEOUT}={session}")
            except ValueError as exc:
                results.append(result(Errors.InvalidConfigurationError.errno, str(exc)))
                continue
            if not request.validate_only and configs != held:
                self.ctx.emit(r.GroupConfig(resource.resource_name, r.GroupConfigValue(configs) if configs else None))
            results.append(result())
        return Response(responses=results)
