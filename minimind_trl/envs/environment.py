"""Tools as TRL calls them: the environment class, TRL 1.16's call rule, the think-opener column.

Training rollouts run in the project's driver (`minimind_trl.envs.rollout.drive`, through TRL's
public ``rollout_func``), which follows TRL 1.16's tool loop id for id; this module keeps what
that loop and TRL's other tool users (the distillation trainer's ``tools=``) define:

* `make_environment_class` builds a `ToolEnvironment` subclass from a `ToolRegistry`: one public
  method per tool, with the tool's real signature, type hints and docstring (what TRL's
  ``environment_factory`` and ``tools=`` read to build schemas), each method running the registry
  and logging the call (``call_log``).
* `call_as_trl` is TRL's rule for one parsed call: ``str(tool(**arguments))``; an unknown tool,
  non-object arguments or any exception become ``str({"error": message})`` (a Python repr), which
  TRL counts as a failure. Our tools never raise: their failures are JSON ``{"error": ...}``
  observations. Training and evaluation both dispatch calls through it, so a model sees the same
  observation for the same call in training and in evaluation.
* `with_open_thinking` adds the per-row ``open_thinking`` column (``thinking_ratio``: upstream's
  share of rollouts whose prompts open a think block); the training rollout applies it to the
  row's prompt and tool turns.
* `ParseGuard` / `install_parse_guard`: TRL reads a reply as plain text when the tokenizer's
  parser raises ValueError or TypeError; the guard turns every other parser failure into one.
"""

from __future__ import annotations

import hashlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any

from minimind_trl.envs.protocol import is_error_observation
from minimind_trl.envs.registry import ParamSpec, ToolRegistry, ToolSpec
from minimind_trl.envs.tools import default_registry

DEFAULT_THINKING_RATIO = 0.1
"""Upstream's share of rollouts whose generation prompts open a think block."""

_PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
             "object": dict}
_RESERVED = {"reset", "get_reward"}


@dataclass
class ToolCallLog:
    """One call that reached the environment: name, arguments, observation, success."""

    name: str
    arguments: dict
    observation: str
    ok: bool


class ToolEnvironment:
    """Base of the generated environment classes (see `make_environment_class`).

    Attributes after ``reset(**row)``: ``gt`` (the row's ground truth, or None), ``task_id``,
    ``open_thinking`` (the row's think-opener flag; None: the caller's default) and ``call_log``
    (a `ToolCallLog` per call that reached this instance).
    Only ``reset`` and the tool methods are public: TRL would expose any other public function.
    """

    _registry: ToolRegistry
    _tool_schemas: list[dict]

    def __init__(self) -> None:
        self.reset()

    def reset(self, **row: Any) -> None:
        """Start a rollout for ``row`` (TRL passes every dataset column); returns None."""
        self.gt = row.get("gt")
        self.task_id = row.get("id")
        flag = row.get("open_thinking")
        self.open_thinking = None if flag is None else bool(flag)
        self.call_log: list[ToolCallLog] = []

    def _call_tool(self, name: str, arguments: dict) -> str:
        observation = self._registry.call(name, arguments)
        self.call_log.append(ToolCallLog(name, dict(arguments), observation,
                                         not is_error_observation(observation)))
        return observation


def environment_tools(environment: Any) -> dict[str, Any]:
    """The tools TRL's loop offers for ``environment``, by name: the bound public functions of
    its class except ``reset`` and ``get_reward``."""
    return {name: getattr(environment, name)
            for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if name not in _RESERVED and not name.startswith("_")}


def call_as_trl(tools: dict[str, Any], name: str, arguments: Any) -> str:
    """The observation TRL 1.16's tool loop writes for one parsed call: ``str(tool(**arguments))``;
    an unknown name or any exception (non-object arguments included) becomes
    ``str({"error": message})``, a Python repr, as in training."""
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        return str(tools[name](**arguments))
    except Exception as error:  # noqa: BLE001 - TRL reports every failure as an observation
        return str({"error": str(error)})


def _annotation(param: ParamSpec) -> Any:
    base = _PY_TYPES[param.json_type]
    if param.enum is not None:
        base = typing.Literal[tuple(param.enum)]
    return base | None if param.nullable else base


def _docstring(spec: ToolSpec) -> str:
    """Google-style docstring that transformers' `get_json_schema` parses back to the spec."""
    lines = [spec.description or spec.name, "", "Args:"]
    lines += [f"    {p.name}: {p.description or p.name}" for p in spec.params.values()]
    return "\n".join(lines)


def tool_method(spec: ToolSpec):
    """A function ``(self, **arguments) -> str`` that runs ``spec`` through the registry and
    shows the tool's real signature, hints and docstring to schema builders."""
    name = spec.name

    def method(self, **arguments):
        return self._call_tool(name, arguments)

    defaults = inspect.signature(spec.func).parameters
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for p in spec.params.values():
        default = inspect.Parameter.empty if p.required else defaults[p.name].default
        params.append(inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=_annotation(p)))
    method.__signature__ = inspect.Signature(params)
    method.__annotations__ = {p.name: _annotation(p) for p in spec.params.values()}
    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(spec)
    return method


def make_environment_class(registry: ToolRegistry | None = None,
                           name: str = "MiniMindToolEnv") -> type[ToolEnvironment]:
    """A `ToolEnvironment` subclass with one public method per registry tool (usable as TRL's
    ``environment_factory``). Default registry: `default_registry()`.

    The methods' schemas (``transformers.utils.get_json_schema``) equal the registry's, except
    that a tool without required parameters loses its empty ``"required": []``; plain TRL also
    lists them alphabetically and offers all of them to every row, where our rollouts render each
    prompt's own tool list.
    """
    registry = default_registry() if registry is None else registry
    namespace: dict[str, Any] = {"_registry": registry, "_tool_schemas": registry.schemas()}
    for tool in registry.names():
        if tool in _RESERVED or tool.startswith("_") or not tool.isidentifier():
            raise ValueError(f"tool name {tool!r} cannot be an environment method")
        namespace[tool] = tool_method(registry.spec(tool))
    return type(name, (ToolEnvironment,), namespace)


def open_thinking_for(key: Any, ratio: float, seed: int) -> bool:
    """Deterministic per-prompt coin: True for a ``ratio`` share of keys (a task id)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < ratio


def with_open_thinking(dataset: Any, ratio: float = DEFAULT_THINKING_RATIO, seed: int = 0,
                       key: str = "id") -> Any:
    """Add a boolean ``open_thinking`` column (`open_thinking_for` of each row's ``key``, or of
    its index when the row has no such field) to a `datasets.Dataset` or a list of dicts.
    The training rollout applies it to the row's prompt and tool turns."""
    def flag(row: dict, index: int) -> bool:
        return open_thinking_for(row.get(key, index), ratio, seed)

    if isinstance(dataset, list):
        return [{**row, "open_thinking": flag(row, i)} for i, row in enumerate(dataset)]
    return dataset.map(lambda row, i: {"open_thinking": flag(row, i)}, with_indices=True)


class ParseGuard:
    """Installed as ``tokenizer.parse_response``: TRL 1.16 reads a reply as plain text (a
    malformed call) only when parsing raises ValueError or TypeError; any other failure of the
    tokenizer's parser (RecursionError on tool-call JSON nested ~1000 deep, ...) is re-raised as
    a ValueError, so it gets that same fallback instead of ending the run. Evaluation
    (`minimind_trl.envs.rollout`) falls back the same way on every exception."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return type(self.tokenizer).parse_response(self.tokenizer, *args, **kwargs)
        except (ValueError, TypeError):
            raise
        except Exception as exc:  # noqa: BLE001 - any parser failure is a malformed reply
            raise ValueError(f"the reply could not be parsed ({type(exc).__name__})") from exc


def install_parse_guard(tokenizer: Any) -> None:
    """Route ``tokenizer.parse_response`` through :class:`ParseGuard` (once); TRL's GRPO and
    distillation tool loops both parse replies through it."""
    if not isinstance(tokenizer.__dict__.get("parse_response"), ParseGuard):
        tokenizer.parse_response = ParseGuard(tokenizer)
