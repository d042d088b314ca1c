"""Plugin loading: tools, reward functions and verifiers by dotted path or by file path.

A *spec* names a Python object:

* ``"package.module:attr"`` — import the module, then follow ``attr`` (dots allowed:
  ``"pkg.mod:Class.method"``);
* ``"path/to/file.py:attr"`` — load the file as a module (once per resolved path; it is put in
  `sys.modules` under a name derived from the path), then follow ``attr``;
* without ``:attr`` the spec names the module itself (``"pkg.module"`` or ``"path/file.py"``).

Failures raise `PluginError` (an `ImportError`) saying which spec failed and why.

Tool plugins (`load_tool_plugin`): a module exposing ``register(registry)`` (the built-in tools
are loaded this way) or a ``TOOLS`` sequence of functions; or a single tool function
(``"file.py:compound_interest"``).

Reward functions are found by name (`get_reward_function`): names registered with
`register_reward_function` (a TRL reward function) or `register_reward_factory` (a function
returning one, given options such as weights or a model path), else a spec. Verifiers likewise
(`register_verifier`, `get_verifier`). The built-in names live in `minimind_trl.rewards`, which
is imported on the first look-up.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, Callable


class PluginError(ImportError):
    """A plugin spec could not be resolved."""


def _split(spec: str) -> tuple[str, str | None]:
    target, sep, attr = spec.rpartition(":")
    if not sep or not attr or "/" in attr or "\\" in attr:
        return spec, None  # no attribute part (or a Windows drive colon)
    return target, attr


def _load_file(path_text: str) -> types.ModuleType:
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise PluginError(f"plugin file not found: {path_text!r} (resolved to {path})")
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"minimind_trl_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise PluginError(f"error while executing plugin file {path}: "
                          f"{type(exc).__name__}: {exc}") from exc
    return module


def load_module(target: str) -> types.ModuleType:
    """Import a module by dotted name, or load it from a ``.py`` file path."""
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _load_file(target)
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise PluginError(f"cannot import plugin module {target!r}: {exc}") from exc


def load_object(spec: str) -> Any:
    """Resolve a spec (``"pkg.module:attr"``, ``"path/file.py:attr"``, or a module alone)."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"a plugin spec must be a non-empty string, got {spec!r}")
    target, attr = _split(spec.strip())
    obj: Any = load_module(target)
    for part in (attr.split(".") if attr else []):
        if not hasattr(obj, part):
            raise PluginError(f"plugin {spec!r}: {target!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_tool_plugin(registry, spec: str) -> list[str]:
    """Add a plugin's tools to a `ToolRegistry`; returns the names added."""
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


# --------------------------------------------------------------------------------------------
# Named registries for reward functions and verifiers.

_REWARD_FACTORIES: dict[str, Callable[..., Callable]] = {}
_VERIFIERS: dict[str, Callable] = {}


def _looks_like_spec(name: str) -> bool:
    return ":" in name or name.endswith(".py")


def register_reward_function(name: str | None = None):
    """Decorator: register a TRL reward function ``f(prompts, completions, **kwargs)`` under
    ``name`` (default: its ``__name__``)."""
    def decorator(func: Callable) -> Callable:
        key = name or func.__name__

        def factory(**options):
            if options:
                raise TypeError(f"reward function {key!r} takes no options, got {sorted(options)}")
            return func
        _REWARD_FACTORIES[key] = factory
        return func
    return decorator


def register_reward_factory(name: str):
    """Decorator: register ``factory(**options) -> reward function`` under ``name``."""
    def decorator(factory: Callable[..., Callable]) -> Callable[..., Callable]:
        _REWARD_FACTORIES[name] = factory
        return factory
    return decorator


def _ensure_builtins() -> None:
    importlib.import_module("minimind_trl.rewards")


def reward_function_names() -> list[str]:
    _ensure_builtins()
    return sorted(_REWARD_FACTORIES)


def get_reward_function(name: str, **options) -> Callable:
    """A reward function by registered name (options go to its factory) or by spec."""
    _ensure_builtins()
    if name in _REWARD_FACTORIES:
        return _REWARD_FACTORIES[name](**options)
    if _looks_like_spec(name):
        obj = load_object(name)
        if options:
            obj = obj(**options)
        if not callable(obj):
            raise PluginError(f"reward plugin {name!r} is not callable")
        return obj
    raise PluginError(f"unknown reward function {name!r}; registered: "
                      f"{', '.join(sorted(_REWARD_FACTORIES))} (or give a module:attr spec)")


def register_verifier(name: str | None = None):
    """Decorator: register a verifier ``v(final_answer, gt, tool_results=()) -> Verification``."""
    def decorator(func: Callable) -> Callable:
        _VERIFIERS[name or func.__name__] = func
        return func
    return decorator


def get_verifier(name: str) -> Callable:
    """A verifier by registered name or by spec."""
    _ensure_builtins()
    if name in _VERIFIERS:
        return _VERIFIERS[name]
    if _looks_like_spec(name):
        obj = load_object(name)
        if not callable(obj):
            raise PluginError(f"verifier plugin {name!r} is not callable")
        return obj
    raise PluginError(f"unknown verifier {name!r}; registered: {', '.join(sorted(_VERIFIERS))}")
