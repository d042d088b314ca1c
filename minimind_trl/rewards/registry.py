"""The reward-function and verifier registries, and the one entry point that builds a run's rewards.

A reward *name* in a recipe is either a registered name or a plugin spec
(``"path/file.py:function"``, ``"package.module:attr"``; see `minimind_trl.plugins`).

Registered names map to *factories*: ``factory(**options) -> reward function`` (a plain reward
function registered with `register_reward_function` becomes a factory that takes no options).
Built-in names (the table `BUILTIN_REWARDS`):

* ``task_reward`` — `make_task_reward` (options ``success_weight``, ``coverage_weight``,
  ``malformed_penalty``);
* ``success_reward``, ``coverage_reward``, ``format_reward`` — fixed functions, no options;
* ``minimind_agent_reward`` — `make_minimind_agent_reward` (upstream parity; judges tool calls
  against the run's tools);
* ``reward_model`` — `make_reward_model_reward` (option ``path``).

Tool-aware factories: a factory that judges tool calls declares it needs the run's
`ToolRegistry` (``register_reward_factory(name, uses_tool_registry=True)``, or the
`uses_tool_registry` decorator on a factory named by spec). It is then called as
``factory(registry=<the run's ToolRegistry>, **options)``. `build_reward_functions(specs,
registry)` is how a run builds its rewards, so such rewards see the run's ``rollout.tools`` plugins
and ``rollout.tool_names``; `get_reward_function` without ``tool_registry`` passes the built-in
tools (`default_registry()`).

Verifiers, ``v(final_answer, gt, tool_results=()) -> Verification``: ``gt`` (`verify`) built in,
others by `register_verifier` or by spec (`get_verifier`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minimind_trl.envs.registry import ToolRegistry
from minimind_trl.envs.tools import default_registry
from minimind_trl.plugins import PluginError, is_spec, load_object
from minimind_trl.rewards.reward_model import make_reward_model_reward
from minimind_trl.rewards.rewards import (
    RewardFunction,
    coverage_reward,
    format_reward,
    make_task_reward,
    success_reward,
)
from minimind_trl.rewards.upstream import make_minimind_agent_reward
from minimind_trl.rewards.verifier import verify

RewardFactory = Callable[..., RewardFunction]
USES_TOOL_REGISTRY = "uses_tool_registry"
"""The attribute a factory sets to True to receive the run's `ToolRegistry` as ``registry=``."""


@dataclass(frozen=True)
class RewardEntry:
    """A registered reward: its factory and whether the factory takes the run's tool registry."""

    factory: RewardFactory
    uses_tool_registry: bool = False


def uses_tool_registry(factory: RewardFactory) -> RewardFactory:
    """Decorator: mark a reward factory as needing the run's tools (called with ``registry=``)."""
    setattr(factory, USES_TOOL_REGISTRY, True)
    return factory


def _fixed(func: RewardFunction, name: str) -> RewardFactory:
    """A factory that returns ``func`` itself and refuses options."""

    def factory(**options) -> RewardFunction:
        if options:
            raise TypeError(f"reward function {name!r} takes no options, got {sorted(options)}")
        return func
    return factory


BUILTIN_REWARDS: dict[str, RewardEntry] = {
    "task_reward": RewardEntry(make_task_reward),
    "success_reward": RewardEntry(_fixed(success_reward, "success_reward")),
    "coverage_reward": RewardEntry(_fixed(coverage_reward, "coverage_reward")),
    "format_reward": RewardEntry(_fixed(format_reward, "format_reward")),
    "minimind_agent_reward": RewardEntry(make_minimind_agent_reward, uses_tool_registry=True),
    "reward_model": RewardEntry(make_reward_model_reward),
}
BUILTIN_VERIFIERS: dict[str, Callable] = {"gt": verify}

_REWARDS: dict[str, RewardEntry] = dict(BUILTIN_REWARDS)
_VERIFIERS: dict[str, Callable] = dict(BUILTIN_VERIFIERS)


def register_reward_function(name: str | None = None):
    """Decorator: register a TRL reward function ``f(prompts, completions, **kwargs)`` under
    ``name`` (default: its ``__name__``)."""
    def decorator(func: RewardFunction) -> RewardFunction:
        key = name or func.__name__
        _REWARDS[key] = RewardEntry(_fixed(func, key))
        return func
    return decorator


def register_reward_factory(name: str, *, uses_tool_registry: bool | None = None):
    """Decorator: register ``factory(**options) -> reward function`` under ``name``. With
    ``uses_tool_registry`` (default: the factory's own `USES_TOOL_REGISTRY` mark) the factory is
    also given ``registry=`` the run's `ToolRegistry`."""
    def decorator(factory: RewardFactory) -> RewardFactory:
        wants = getattr(factory, USES_TOOL_REGISTRY, False) if uses_tool_registry is None else uses_tool_registry
        _REWARDS[name] = RewardEntry(factory, bool(wants))
        return factory
    return decorator


def reward_function_names() -> list[str]:
    """Registered reward names (built-ins and those registered by loaded plugins), sorted."""
    return sorted(_REWARDS)


def _spec_entry(spec: str, has_options: bool) -> RewardEntry:
    """A reward named by spec: a factory when options are given or when it is marked as using the
    tool registry, else the reward function itself."""
    obj = load_object(spec)
    if not callable(obj):
        raise PluginError(f"reward plugin {spec!r} is not callable")
    if getattr(obj, USES_TOOL_REGISTRY, False):
        return RewardEntry(obj, uses_tool_registry=True)
    if has_options:
        return RewardEntry(obj)
    return RewardEntry(lambda: obj)


def get_reward_function(name: str, *, tool_registry: ToolRegistry | None = None, **options) -> RewardFunction:
    """A reward function by registered name (``options`` go to its factory) or by spec.

    A factory that uses the tool registry gets ``registry=tool_registry`` (the built-in tools,
    `default_registry()`, when none is given)."""
    if name in _REWARDS:
        entry = _REWARDS[name]
    elif is_spec(name):
        entry = _spec_entry(name, bool(options))
    else:
        raise PluginError(f"unknown reward function {name!r}; registered: "
                          f"{', '.join(reward_function_names())} (or give a module:attr spec)")
    if entry.uses_tool_registry:
        if "registry" in options:
            raise TypeError(f"reward {name!r} is given the run's tools; 'registry' is not an option")
        options = {**options, "registry": default_registry() if tool_registry is None else tool_registry}
    func = entry.factory(**options)
    if not callable(func):
        raise PluginError(f"reward {name!r} did not give a callable reward function")
    return func


def build_reward_functions(specs: list[dict], registry: ToolRegistry) -> tuple[list[RewardFunction], list[float]]:
    """A run's reward functions and weights from its recipe ``rewards`` entries
    (``{"name", "weight", "options"}``); ``registry`` is the run's `ToolRegistry` (built from
    ``rollout.tools`` and ``rollout.tool_names``), given to every factory that uses it."""
    funcs = [get_reward_function(spec["name"], tool_registry=registry, **(spec.get("options") or {}))
             for spec in specs]
    return funcs, [float(spec.get("weight", 1.0)) for spec in specs]


def register_verifier(name: str | None = None):
    """Decorator: register a verifier ``v(final_answer, gt, tool_results=(), question="") -> Verification``
    (``question``: the task's question, as `minimind_trl.rewards.evaluate_completion` passes it)."""
    def decorator(func: Callable) -> Callable:
        _VERIFIERS[name or func.__name__] = func
        return func
    return decorator


def get_verifier(name: str) -> Callable:
    """A verifier by registered name or by spec."""
    if name in _VERIFIERS:
        return _VERIFIERS[name]
    if is_spec(name):
        obj = load_object(name)
        if not callable(obj):
            raise PluginError(f"verifier plugin {name!r} is not callable")
        return obj
    raise PluginError(f"unknown verifier {name!r}; registered: {', '.join(sorted(_VERIFIERS))}")


__all__ = [
    "BUILTIN_REWARDS", "BUILTIN_VERIFIERS", "USES_TOOL_REGISTRY", "RewardEntry", "RewardFactory",
    "build_reward_functions", "get_reward_function", "get_verifier", "register_reward_factory",
    "register_reward_function", "register_verifier", "reward_function_names", "uses_tool_registry",
]
