"""Tools for the multi-turn environment: the public face of `minimind_trl.envs`.

* `ToolRegistry` (schemas from type hints and Google-style docstrings; ``call`` never raises
  and returns an observation: ``{"result": "<value>"}`` or ``{"error": "<message>"}``),
  `format_number`, `ToolError` — see `minimind_trl.envs.registry`;
* the built-in tools and their fixed tables (`EXCHANGE_RATES`, `UNIT_FACTORS`, ...) — see
  `minimind_trl.envs.builtin_tools`, itself loaded as a plugin;
* `parse_tool_calls` — see `minimind_trl.envs.parsing`;
* `load_tool_plugin(registry, spec)` — add a tool plugin's tools to a registry (a module with
  ``register(registry)`` or a ``TOOLS`` sequence, or a single tool function; specs are resolved by
  `minimind_trl.plugins.load_object`);
* `default_registry()` — a fresh registry holding the built-ins plus any extra tool plugins;
* `run_registry()` — the tools of one run (``rollout.tools`` plugins, narrowed to
  ``rollout.tool_names``), used by training, evaluation and the rewards that judge tool calls.
"""

from __future__ import annotations

import types

from minimind_trl.envs.builtin_tools import (
    BUILTIN_TOOLS,
    EXCHANGE_RATES,
    TEMPERATURE_UNITS,
    UNIT_ALIASES,
    UNIT_FACTORS,
    convert_units,
    exchange_rate,
)
from minimind_trl.envs.parsing import ToolCallParse, parse_tool_calls
from minimind_trl.envs.registry import ToolError, ToolRegistry, ToolSpec, format_number
from minimind_trl.envs.safe_math import evaluate_expression
from minimind_trl.plugins import PluginError, load_object

BUILTIN_TOOL_PLUGIN = "minimind_trl.envs.builtin_tools"
DEFAULT_TOOL_NAMES = tuple(tool.__name__ for tool in BUILTIN_TOOLS)


def load_tool_plugin(registry: ToolRegistry, spec: str) -> list[str]:
    """Add a plugin's tools to a `ToolRegistry`; returns the names added.

    The spec names a module exposing ``register(registry)`` (the built-in tools are loaded this
    way) or a ``TOOLS`` sequence of functions, or a single tool function
    (``"file.py:compound_interest"``)."""
    before = set(registry.names())
    obj = load_object(spec)
    if isinstance(obj, types.ModuleType):
        if callable(getattr(obj, "register", None)):
            obj.register(registry)
        elif getattr(obj, "TOOLS", None) is not None:
            for tool in obj.TOOLS:
                registry.register(tool)
        else:
            raise PluginError(f"tool plugin {spec!r} has neither register(registry) nor TOOLS")
    elif callable(obj):
        registry.register(obj)
    else:
        raise PluginError(f"tool plugin {spec!r} is not a module or a function")
    return [name for name in registry.names() if name not in before]


def default_registry(plugins: list[str] | tuple[str, ...] = (), timeout_s: float = 1.0
                     ) -> ToolRegistry:
    """A new `ToolRegistry` with the eight built-in tools (calculate_math, unit_converter,
    get_exchange_rate, get_current_weather, get_current_time, translate_text, random_number,
    text_length), registered through the plugin loader, then each extra tool plugin spec in
    ``plugins`` (see `load_tool_plugin`)."""
    registry = ToolRegistry(timeout_s=timeout_s)
    for spec in (BUILTIN_TOOL_PLUGIN, *plugins):
        load_tool_plugin(registry, spec)
    return registry


def run_registry(plugins: list[str] | tuple[str, ...] = (), tool_names: list[str] | tuple[str, ...] | None = None,
                 timeout_s: float = 1.0) -> ToolRegistry:
    """The tools of a run (a recipe's ``rollout.tools`` and ``rollout.tool_names``): the built-ins
    plus ``plugins``, narrowed to ``tool_names`` when given (unknown names raise ValueError). Training
    and evaluation build their registry here, so a run is evaluated with the tools it trained with."""
    registry = default_registry(plugins=plugins, timeout_s=timeout_s)
    if tool_names is None:
        return registry
    unknown = [name for name in tool_names if name not in registry]
    if unknown:
        raise ValueError(f"unknown tool(s) {unknown}; known: {registry.names()}")
    subset = ToolRegistry(timeout_s=registry.timeout_s)
    for name in tool_names:
        subset.register(registry.spec(name).func, name=name)
    return subset


__all__ = [
    "BUILTIN_TOOLS", "DEFAULT_TOOL_NAMES", "EXCHANGE_RATES", "TEMPERATURE_UNITS", "UNIT_ALIASES",
    "UNIT_FACTORS", "ToolCallParse", "ToolError", "ToolRegistry", "ToolSpec", "convert_units",
    "default_registry", "evaluate_expression", "exchange_rate", "format_number",
    "load_tool_plugin", "parse_tool_calls", "run_registry",
]
