"""Operator plugins: Python modules (or entry points) whose hooks join the control plane's bus.

A plugin module exposes `plugin(input: PluginInput)`, sync or async, returning a mapping of hook
name to an async `hook(input, output)`: OpenCode's Plugin shape, in Python. Plugins load in the
configured order at start; a plugin that cannot be loaded stops the control plane with a clear error
(an operator's policy must not silently vanish).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, cast

from controlplane.core.calls.hooks import HOOK_NAMES, Hook, HookBus
from controlplane.errors import ConfigError

ENTRY_POINT_GROUP = "ocsandbox.plugins"


@dataclass(frozen=True)
class PluginInput:
    instance: str
    """The control plane instance name."""


def _resolve(spec: str) -> Any:
    if spec.startswith("entrypoint:"):
        name = spec.removeprefix("entrypoint:")
        found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
        if not found:
            raise ConfigError(f"plugin {spec}: no entry point {name!r} in group {ENTRY_POINT_GROUP}")
        return found[0].load()
    return importlib.import_module(spec)


async def load_plugins(specs: list[str], bus: HookBus, plugin_input: PluginInput) -> list[str]:
    """Registers every plugin's hooks on `bus`, in order; returns the loaded specs."""
    loaded = []
    for spec in specs:
        try:
            target = _resolve(spec)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"plugin {spec} could not be imported: {type(exc).__name__}: {exc}") from exc
        factory = getattr(target, "plugin", target)
        if not callable(factory):
            raise ConfigError(f"plugin {spec} has no callable `plugin(input)`")
        hooks = factory(plugin_input)
        if inspect.isawaitable(hooks):
            hooks = await hooks
        if not isinstance(hooks, Mapping):
            raise ConfigError(f"plugin {spec}: plugin(input) must return a mapping of hook name to hook")
        for name, hook in hooks.items():
            if name not in HOOK_NAMES:
                raise ConfigError(f"plugin {spec}: unknown hook {name!r}; known hooks: {', '.join(sorted(HOOK_NAMES))}")
            if not inspect.iscoroutinefunction(hook):
                raise ConfigError(f"plugin {spec}: hook {name} must be an async function")
            bus.add(name, cast(Hook, hook), origin=spec)
        loaded.append(spec)
    return loaded
