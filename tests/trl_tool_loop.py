"""TRL 1.16's own tool loop with our protocol's hooks: the oracle the training driver is checked against.

Until issue 39 the project trained through TRL's tool loop (``GRPOTrainer(environment_factory=...)``)
with these hooks, private overrides of TRL's rendering of prompts and tool turns, mixed into the
trainer. The training rollouts now come from the project's driver (`minimind_trl.envs.rollout.drive`,
through TRL's public ``rollout_func``), which follows that loop id for id; the tests run the two
side by side. `record_from_completion` reads a `TrajectoryRecord` from TRL's parsed completion, an
independent reading of what the driver records turn by turn.
"""

from __future__ import annotations

from typing import Any

from minimind_trl.conversation import task_prompt
from minimind_trl.envs.environment import ToolEnvironment, install_parse_guard
from minimind_trl.envs.protocol import (
    TrajectoryRecord,
    is_error_observation,
    message_calls,
    message_malformed_calls,
    prompt_ids_for,
    recordable,
    tool_turn_ids,
)


def record_from_completion(completion: list[dict], completion_ids: list[int],
                           tool_mask: list[int] | None, eos_token_id: int) -> TrajectoryRecord:
    """Build a `TrajectoryRecord` from TRL's parsed completion messages (assistant / tool dicts
    in order), the completion ids [C] and the tool mask [C] (None: every token is the model's)."""
    record = TrajectoryRecord()
    assistant = None
    for message in completion:
        if message.get("role") == "assistant":
            assistant = message
            record.n_turns += 1
            record.tool_calls += [{"turn": record.n_turns - 1, "name": recordable(fn.get("name")),
                                   "arguments": recordable(fn.get("arguments"))} for fn in message_calls(message)]
            record.malformed_calls += message_malformed_calls(message)
        elif message.get("role") == "tool":
            assistant = None
            observation = str(message.get("content"))
            record.observations.append(observation)
            record.failed_calls += is_error_observation(observation)
    record.valid_calls = len(record.observations) - record.failed_calls
    record.truncated = bool(completion_ids) and completion_ids[-1] != eos_token_id
    last_has_calls = assistant is not None and bool(assistant.get("tool_calls"))
    record.pending_call = last_has_calls and not record.truncated
    record.finished = assistant is not None and not last_has_calls and not record.truncated
    record.n_model_tokens = len(completion_ids) if tool_mask is None else int(sum(tool_mask))
    return record


class TRLToolLoopHooks:
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
