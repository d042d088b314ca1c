"""Tool registry: JSON schemas from Python signatures, and a `call` that never raises.

A tool is a plain Python function with type hints and a Google-style docstring::

    def unit_converter(value: float, from_unit: str, to_unit: str) -> str:
        '''Convert a value between units.

        Args:
            value: The number to convert.
            from_unit: Source unit, e.g. "km".
            to_unit: Target unit, e.g. "m".
        '''

`ToolRegistry.register` turns it into the OpenAI function schema
``{"type": "function", "function": {"name", "description", "parameters": {"type": "object",
"properties": {...}, "required": [...]}}}`` (parameters without a default are required).

`ToolRegistry.call(name, arguments)` returns an observation, a JSON string:

* success: ``{"result": "<value>"}`` — the value is always a string; numbers are written by
  `format_number` (e.g. ``{"result": "9472"}``);
* failure: ``{"error": "<message>"}`` for an unknown tool, arguments that are not a JSON object,
  missing / unexpected / mistyped arguments (checked against the schema before the function
  runs), an over-long string argument, an exception inside the tool, a numeric result that is
  not finite or exceeds ``MAX_RESULT_MAGNITUDE`` (1e18, the calculator's bound), or a call that
  took longer than ``timeout_s``. Lone surrogates in an observation become U+FFFD and chat
  markup is escaped (see `_observation`). Tool arguments come from a model and are untrusted: tools must bound their
  own work up-front (see `safe_math`); the wall-clock check here only reports a slow call, it
  cannot interrupt one (signals do not work off the main thread).
"""

from __future__ import annotations

import inspect
import json
import math
import re
import time
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from minimind_trl.envs.parsing import loads_call_json

MAX_ARGUMENTS_CHARS = 65_536
"""Longest accepted JSON text for the arguments of one call."""
MAX_STRING_ARGUMENT_CHARS = 4_096
"""Longest accepted string argument (longer ones are a schema violation)."""
MAX_RESULT_CHARS = 2_048
"""Longer tool results are cut to this many characters."""
DEFAULT_TIMEOUT_S = 1.0


class ToolError(Exception):
    """Raised by a tool for a bad request; its message becomes the ``error`` observation."""


def format_number(x: float | int) -> str:
    """Write a number the way observations do.

    An integral value prints without a decimal point (``9472.0`` → ``"9472"``); any other value
    is rounded to 4 decimal places and trailing zeros are stripped (``2/3`` → ``"0.6667"``,
    ``2.5`` → ``"2.5"``, ``1.00001`` → ``"1"``). ``-0`` prints as ``"0"``; non-finite floats
    print as ``"inf"``, ``"-inf"``, ``"nan"``.
    """
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"format_number expects an int or float, got {type(x).__name__}")
    if isinstance(x, int):
        return str(x)
    if not math.isfinite(x):
        return str(x)
    if x.is_integer():
        return str(int(x))
    text = f"{round(x, 4):.4f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
               dict: "object"}


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its JSON type (``"string"``, ``"number"``, ...), enum values, requiredness."""

    name: str
    json_type: str
    description: str = ""
    required: bool = True
    nullable: bool = False
    enum: tuple | None = None


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool: the function, its parameters and its OpenAI-style schema."""

    name: str
    func: Callable[..., Any]
    description: str
    params: dict[str, ParamSpec] = field(default_factory=dict)

    @property
    def schema(self) -> dict:
        properties = {}
        for p in self.params.values():
            prop: dict[str, Any] = {"type": p.json_type}
            if p.enum is not None:
                prop["enum"] = list(p.enum)
            if p.nullable:
                prop["nullable"] = True
            if p.description:
                prop["description"] = p.description
            properties[p.name] = prop
        required = [p.name for p in self.params.values() if p.required]
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": properties, "required": required}}}


def _json_type(annotation: Any) -> tuple[str, bool, tuple | None]:
    """(json type, nullable, enum) of a type hint; `X | None` is nullable, `Literal` an enum."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported union type hint {annotation!r}")
        json_type, _, enum = _json_type(args[0])
        return json_type, True, enum
    if origin is typing.Literal:
        values = typing.get_args(annotation)
        return _JSON_TYPES[type(values[0])], False, tuple(values)
    base = origin or annotation
    if base not in _JSON_TYPES:
        raise TypeError(f"unsupported type hint {annotation!r}")
    return _JSON_TYPES[base], False, None


_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg name: arg description}).

    The description is the text before the first section header (``Args:``, ``Returns:``, ...);
    an argument's description may continue on more-indented lines, joined with spaces.
    """
    lines = inspect.cleandoc(doc or "").splitlines()
    description, args, section, current, args_indent = [], {}, None, None, 0
    for line in lines:
        stripped = line.strip()
        header = re.fullmatch(r"(Args|Arguments|Parameters|Returns|Raises|Examples?|Notes?):",
                              stripped)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            description.append(line)
        elif section in ("Args", "Arguments", "Parameters") and stripped:
            match = _ARG_LINE.match(stripped)
            indent = len(line) - len(line.lstrip())
            if match and (current is None or indent <= args_indent):
                current, args_indent = match.group(1), indent
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(description).strip(), args


def make_tool_spec(func: Callable[..., Any], name: str | None = None) -> ToolSpec:
    """Build a `ToolSpec` from a function's signature, type hints and docstring."""
    description, arg_docs = parse_docstring(func.__doc__)
    hints = typing.get_type_hints(func)
    params = {}
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {func.__name__!r}: *args/**kwargs are not allowed")
        if pname not in hints:
            raise TypeError(f"tool {func.__name__!r}: parameter {pname!r} has no type hint")
        json_type, nullable, enum = _json_type(hints[pname])
        params[pname] = ParamSpec(pname, json_type, arg_docs.get(pname, ""),
                                  required=param.default is param.empty, nullable=nullable,
                                  enum=enum)
    return ToolSpec(name or func.__name__, func, description, params)


def _check_value(spec: ParamSpec, value: Any) -> tuple[Any, str | None]:
    """Validate one argument; returns (possibly normalised value, error message or None)."""
    if value is None:
        return value, None if spec.nullable else f"argument {spec.name!r} must not be null"
    kind = spec.json_type
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool)
        or isinstance(value, float) and value.is_integer(),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]
    if not ok:
        return value, f"argument {spec.name!r} must be of type {kind}, got {type(value).__name__}"
    if kind == "integer":
        value = int(value)
    if kind == "number" and isinstance(value, float) and not math.isfinite(value):
        return value, f"argument {spec.name!r} must be a finite number"
    if kind == "string" and len(value) > MAX_STRING_ARGUMENT_CHARS:
        limit = MAX_STRING_ARGUMENT_CHARS
        return value, f"argument {spec.name!r} is longer than {limit} characters"
    if spec.enum is not None and value not in spec.enum:
        return value, f"argument {spec.name!r} must be one of {list(spec.enum)}"
    return value, None


MAX_RESULT_MAGNITUDE = 10**18
"""Numeric results must be finite with ``|x| <= 1e18`` (the calculator's own bound)."""
_SURROGATE = re.compile("[\ud800-\udfff]")
_CHAT_MARKUP = re.compile(r"<(?=\|[A-Za-z0-9_]{1,32}\|>|/?(?:tool_call|tool_response|think)>)")


def _observation(key: str, value: str) -> str:
    """``{key: value}`` as JSON. A lone surrogate (e.g. an argument echoed from a model's
    ``"\\ud800"``) becomes U+FFFD, so every observation encodes as UTF-8 and tokenises; the
    ``<`` of chat markup (``<|im_end|>``, ``<|im_start|>``, ``</tool_response>``, ``<think>``, ...)
    is written as the JSON escape ``\\u003c``: the same value for a JSON reader, but never a
    special token in the next turn."""
    text = _SURROGATE.sub("\ufffd", json.dumps({key: value}, ensure_ascii=False))
    return _CHAT_MARKUP.sub(r"\\u003c", text)


def error_observation(message: str) -> str:
    """``{"error": message}`` as a JSON string."""
    return _observation("error", message)


class ToolRegistry:
    """Named tools with schemas; `call` validates arguments and turns every failure into an
    ``{"error": ...}`` observation."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.timeout_s = timeout_s
        self._tools: dict[str, ToolSpec] = {}

    def register(self, func: Callable[..., Any] | None = None, *, name: str | None = None,
                 replace: bool = False):
        """Register a tool function (usable as ``@registry.register`` or
        ``registry.register(func, name=...)``); returns the function unchanged."""
        if func is None:
            return lambda f: self.register(f, name=name, replace=replace)
        spec = make_tool_spec(func, name)
        if spec.name in self._tools and not replace:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._tools[spec.name] = spec
        return func

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def spec(self, name: str) -> ToolSpec:
        return self._tools[name]

    def schemas(self, names: list[str] | None = None) -> list[dict]:
        """OpenAI function schemas, in registration order (or in the order of ``names``)."""
        return [self._tools[n].schema for n in (self.names() if names is None else names)]

    def validate(self, name: str, arguments: dict | str) -> tuple[dict | None, str | None]:
        """(normalised arguments, None) for a valid call, else (None, error message)."""
        if not isinstance(name, str) or name not in self._tools:
            shown = name if isinstance(name, str) and len(name) <= 64 else "<invalid name>"
            return None, f"unknown tool {shown!r}; available tools: {', '.join(self._tools)}"
        if isinstance(arguments, str):
            if len(arguments) > MAX_ARGUMENTS_CHARS:
                return None, f"arguments longer than {MAX_ARGUMENTS_CHARS} characters"
            try:
                arguments = loads_call_json(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as exc:
                return None, f"arguments are not valid JSON: {str(exc)[:120]}"
        if not isinstance(arguments, dict):
            return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
        params = self._tools[name].params
        extra = [k for k in arguments if k not in params]
        if extra:
            return None, f"unexpected argument(s) for {name}: {', '.join(map(str, extra))[:200]}"
        missing = [p.name for p in params.values() if p.required and p.name not in arguments]
        if missing:
            return None, f"missing required argument(s) for {name}: {', '.join(missing)}"
        clean = {}
        for key, value in arguments.items():
            clean[key], error = _check_value(params[key], value)
            if error:
                return None, error
        return clean, None

    def call(self, name: str, arguments: dict | str) -> str:
        """Run a tool; always returns an observation JSON string and never raises."""
        try:
            clean, error = self.validate(name, arguments)
            if error:
                return error_observation(error)
            start = time.perf_counter()
            try:
                value = self._tools[name].func(**clean)
            except ToolError as exc:
                return error_observation(str(exc))
            except Exception as exc:  # noqa: BLE001 - a tool failure is an observation
                return error_observation(f"{name} failed: {type(exc).__name__}: {str(exc)[:200]}")
            if time.perf_counter() - start > self.timeout_s:
                return error_observation(f"{name} timed out after {self.timeout_s:g} s")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not math.isfinite(value) or abs(value) > MAX_RESULT_MAGNITUDE:
                    return error_observation(f"{name}: the result exceeds the magnitude limit "
                                             f"{MAX_RESULT_MAGNITUDE:.0e}")
                value = format_number(value)
            elif not isinstance(value, str):
                value = json.dumps(value, ensure_ascii=False)
            return _observation("result", value[:MAX_RESULT_CHARS])
        except Exception as exc:  # noqa: BLE001 - defensive: the contract is "never raises"
            return error_observation(f"internal error: {type(exc).__name__}")
