"""The tool environment for TRL's multi-turn loop (``GRPOTrainer(environment_factory=...)``).

How TRL 1.16 drives an environment (read from ``trl/trainer/grpo_trainer.py``):

* ``environment_factory()`` is called with no argument; one instance serves one rollout and is
  reused (``reset``) across batches. Every public *function defined on the class*
  (``inspect.isfunction`` on ``type(instance)``) except ``reset`` and ``get_reward`` becomes a
  tool, called as ``method(**arguments)`` with the arguments parsed from the reply (string
  values cast to the schema type); ``str()`` of its return value is the tool message.
* ``reset(**row)`` runs before generation with every column of the row (``prompt``, ``gt``,
  ``id``, ...). A non-None return is appended to the last prompt message; ours returns None.
  Reward functions get the same columns plus ``prompts``, ``completions`` (parsed messages),
  ``completion_ids``, ``environments`` (these instances), ``trainer_state``, ``log_extra``,
  ``log_metric``.
* A call to an unknown tool, with non-object arguments, or that raises never reaches the
  environment's logic: TRL writes ``str({"error": ...})`` (a Python repr) as the observation and
  counts it in ``tools/failure_frequency``. Our tools never raise; their failures are JSON
  ``{"error": ...}`` observations that TRL does *not* count: read the `TrajectoryRecord`s.
  Evaluation dispatches calls the same way (`call_as_trl`), so a model sees the same observation
  for the same call in training and in evaluation.
* Loop: generate; rows whose parsed reply has calls (a reply with any malformed block parses
  as plain text) run them, get the tool turn appended as ids and generate again, at most
  ``GRPOConfig.max_tool_calling_iterations`` times (None = unbounded): that is our
  ``max_tool_turns``. Ids are concatenated, never re-tokenised; ``tool_mask`` is 0 on tool-turn
  tokens and 1 on model tokens, each model turn ending with its trained ``<|im_end|>``. Every
  turn may use up to ``max_completion_length`` new tokens, but the whole completion (tool turns
  included) is cut to ``max_completion_length``.

`make_environment_class` builds the environment from a `ToolRegistry`. `ToolEnvironmentMixin`
(mixed into the GRPOTrainer subclass) makes TRL's prompts and tool turns the same ids as our
evaluation rollout (`minimind_trl.envs.rollout`), both rendered by `minimind_trl.envs.protocol`,
and adds the per-row think opener (``thinking_ratio``, see `with_open_thinking`), the turn-cap
check and per-rollout records (`protocol.record_from_completion`).
"""

from __future__ import annotations

import hashlib
import inspect
import typing
from dataclasses import dataclass
from typing import Any

from minimind_trl.conversation import task_prompt
from minimind_trl.envs.protocol import (
    DEFAULT_MAX_TOOL_TURNS,
    MAX_TOOL_TURNS,
    TrajectoryRecord,
    is_error_observation,
    prompt_ids_for,
    record_from_completion,
    tool_turn_ids,
)
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
    ``open_thinking`` (the row's think-opener flag; None: the trainer's default), ``call_log``
    (a `ToolCallLog` per call that reached this instance, including any TRL then dropped for
    length) and ``record`` (a `TrajectoryRecord`, set by `ToolEnvironmentMixin` after
    generation; None before).
    Only ``reset`` and the tool methods are public: TRL would expose any other public function.
    """

    _registry: ToolRegistry
    _tool_schemas: list[dict]
    max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS

    def __init__(self) -> None:
        self.reset()

    def reset(self, **row: Any) -> None:
        """Start a rollout for ``row`` (TRL passes every dataset column); returns None."""
        self.gt = row.get("gt")
        self.task_id = row.get("id")
        flag = row.get("open_thinking")
        self.open_thinking = None if flag is None else bool(flag)
        self.call_log: list[ToolCallLog] = []
        self.record: TrajectoryRecord | None = None

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
                           max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS,
                           name: str = "MiniMindToolEnv") -> type[ToolEnvironment]:
    """A `ToolEnvironment` subclass with one public method per registry tool; pass the class
    as ``GRPOTrainer(environment_factory=...)``. Default registry: `default_registry()`.

    The methods' schemas (``transformers.utils.get_json_schema``) equal the registry's, except
    that a tool without required parameters loses its empty ``"required": []``; plain TRL also
    lists them alphabetically and offers all of them to every row. `ToolEnvironmentMixin`
    renders each prompt's own tool list, as evaluation does.
    """
    registry = default_registry() if registry is None else registry
    if not 0 <= max_tool_turns <= MAX_TOOL_TURNS:
        raise ValueError(f"max_tool_turns must be in [0, {MAX_TOOL_TURNS}], got {max_tool_turns}")
    namespace: dict[str, Any] = {"_registry": registry, "_tool_schemas": registry.schemas(),
                                 "max_tool_turns": max_tool_turns}
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
    `ToolEnvironment.reset` reads it and `ToolEnvironmentMixin` applies it to every turn."""
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


class ToolEnvironmentMixin:
    """Mix into the GRPOTrainer subclass (``class T(ToolEnvironmentMixin, GRPOTrainer)``) used
    with ``environment_factory=make_environment_class(...)``. It overrides TRL 1.16 internals so
    that training sees exactly the ids our evaluation rollout produces:

    * ``_tokenize_prompts``: each prompt is rendered like `rollout` renders a task: the tools
      are the ones on the prompt's system message (a ``tools`` JSON string, as in task rows;
      all registry tools when absent), trailing empty assistant placeholders are dropped
      (`minimind_trl.conversation.task_prompt`), and
      the generation prompt opens a think block iff the row's ``open_thinking`` column says so
      (rows without it follow ``chat_template_kwargs``). TRL alone renders every row with all
      environment methods, alphabetically, and one batch-wide ``chat_template_kwargs``;
    * ``_get_tool_suffix_ids``: tool turns come from `tool_turn_ids`, with the row's think
      opener; the row is found by identity of its tool messages (if a TRL change breaks this,
      it raises rather than mislabel);
    * ``_generate``: sets ``env.record`` (`TrajectoryRecord`) on each rollout's environment
      before rewards are computed;
    * ``__init__``: TRL parses replies with the registry's schemas, through `ParseGuard`, and it
      checks that ``args.max_tool_calling_iterations`` equals the class's ``max_tool_turns``.
    Without ``environment_factory`` the mixin does nothing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_completions: list | None = None
        self._tool_env_class: type[ToolEnvironment] | None = None
        if self.environment_factories is None:
            return
        if self._multi_environment or self._standalone_tools:
            raise ValueError("ToolEnvironmentMixin supports one environment_factory and no tools=")
        env_class = type(self._environment_pool[None][0])
        if not issubclass(env_class, ToolEnvironment):
            raise ValueError("ToolEnvironmentMixin needs environment_factory=make_environment_class(...)")
        if self.args.max_tool_calling_iterations != env_class.max_tool_turns:
            raise ValueError(
                f"GRPOConfig.max_tool_calling_iterations={self.args.max_tool_calling_iterations} "
                f"but the environment allows max_tool_turns={env_class.max_tool_turns}; set them equal")
        if self.chat_template is not None:
            raise ValueError("the tokenizer's chat template is not prefix-preserving")
        install_parse_guard(self._tokenizer)
        self._env_tools[None] = list(env_class._tool_schemas)
        self._tool_env_class = env_class

    def _row_open_thinking(self, row: int) -> bool:
        flag = self.environments[row].open_thinking
        return bool(self.chat_template_kwargs.get("open_thinking", False)) if flag is None else flag

    def _tokenize_prompts(self, prompts: list):
        if self._tool_env_class is None:
            return super()._tokenize_prompts(prompts)
        prompt_ids = []
        for row, prompt in enumerate(prompts):
            messages, tools = task_prompt({"conversations": prompt})
            prompt_ids.append(prompt_ids_for(self._tokenizer, messages,
                                             tools or self._tool_env_class._tool_schemas,
                                             self._row_open_thinking(row)))
        return prompt_ids, None, {}

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, *args, **kwargs):
        self._loop_completions = completions
        try:
            return super()._tool_call_loop(prompts, prompt_ids, completion_ids, completions,
                                           *args, **kwargs)
        finally:
            self._loop_completions = None

    def _get_tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        if self._tool_env_class is None:
            return super()._get_tool_suffix_ids(tool_messages)
        rows = [i for i, messages in enumerate(self._loop_completions or [])
                if any(m is tool_messages[0] for m in messages)]
        if len(rows) != 1:
            raise RuntimeError("ToolEnvironmentMixin: cannot find the row of a tool turn; this "
                               "TRL version differs from the one the mixin hooks (1.16)")
        return tool_turn_ids(self._tokenizer, [str(m.get("name")) for m in tool_messages],
                             [m["content"] for m in tool_messages], self._row_open_thinking(rows[0]))

    def _generate(self, prompts: list):
        output = super()._generate(prompts)
        _, completion_ids, tool_mask, completions = output[:4]
        if self._tool_env_class is not None:
            for i, env in enumerate(self.environments):
                env.record = record_from_completion(
                    completions[i], completion_ids[i], None if tool_mask is None else tool_mask[i],
                    self._tokenizer.eos_token_id)
        return output
