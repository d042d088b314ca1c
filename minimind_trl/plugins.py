"""Plugin loading: Python objects named by dotted path or by file path (the leaf of the package).

A *spec* names a Python object:

* ``"package.module:attr"`` — import the module, then follow ``attr`` (dots allowed:
  ``"pkg.mod:Class.method"``);
* ``"path/to/file.py:attr"`` — load the file as a module (once per resolved path; it is put in
  `sys.modules` under a name derived from the path), then follow ``attr``;
* without ``:attr`` the spec names the module itself (``"pkg.module"`` or ``"path/file.py"``).

Failures raise `PluginError` (an `ImportError`) saying which spec failed and why.

This module knows nothing about tools or rewards and imports nothing else from the package; each
registry lives with its domain and loads specs through `load_object`:

* tools: `minimind_trl.envs.tools` (`load_tool_plugin`, `default_registry`, `run_registry`);
* reward functions and verifiers: `minimind_trl.rewards.registry` (`get_reward_function`,
  `build_reward_functions`, `register_reward_function`, `register_reward_factory`,
  `register_verifier`, `get_verifier`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any


class PluginError(ImportError):
    """A plugin spec could not be resolved."""


def is_spec(name: str) -> bool:
    """Whether a name is a plugin spec (``"module:attr"`` or ``"path/file.py"``) rather than a
    registered name."""
    return isinstance(name, str) and (":" in name or name.endswith(".py"))


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


__all__ = ["PluginError", "is_spec", "load_module", "load_object"]
