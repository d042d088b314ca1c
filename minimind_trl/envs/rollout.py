"""The one multi-turn driver: evaluation's rollout and training's (TRL's ``rollout_func``).

`drive` runs trajectories of tool use to their end on the engine's decode loop
(`minimind_trl.engine.decode`), by one turn logic (`_take_turn`) under the protocol of
`minimind_trl.envs.protocol` (its ids, parse and call rules), so evaluation scores what training
produced:

1. Each prompt is rendered by the chat template with the generation prompt and the think prefix
   (`protocol.prompt_ids_for`; a task's prompt by `minimind_trl.conversation.task_prompt`: tools
   from the system message, trailing empty assistant placeholders dropped).
2. A model turn ends at its first ``<|im_end|>`` (eos 2, kept: it belongs to the turn) or at its
   token budget.
3. The turn is parsed as TRL 1.16's loop parses it (`protocol.parse_model_turn`:
   ``trl.chat_template_utils.parse_response`` with the tokenizer's ``response_template`` and the
   registry's schemas, which also cast string arguments to the schema types; a reply with any
   malformed ``<tool_call>`` block is plain text). Its calls run as TRL's loop runs them
   (`environment.call_as_trl`: a tool's failure is its ``{"error": ...}`` JSON observation, an
   unknown tool or non-object arguments TRL's ``{'error': ...}`` repr).
4. The tool turn ``\\n<|im_start|>user\\n<tool_response>\\n{obs}\\n</tool_response><|im_end|>\\n
   <|im_start|>assistant\\n`` + think prefix is rendered by the template and appended as ids
   (`protocol.tool_turn_ids`); the row goes on. After ``max_tool_turns`` tool rounds a turn that
   still calls tools stops its row with ``pending_call``.

The two regimes differ only where `TurnRules` and the schedule say:

* evaluation (`rollout`): every model turn may add ``turn_tokens`` ids; a turn that fills them
  stops its row as ``truncated``, unparsed. Schedule ``continuous``: one decode call for the whole
  rollout; a row takes its tool turn and goes on while other rows are mid-turn, from one sampling
  stream per trajectory.
* training (`MiniMindToolGRPOTrainer`'s ``rollout_func``): TRL 1.16's tool loop, id for id (the
  training rollouts of every published run came from it): ``completion_tokens``
  (``max_completion_length``) bounds the whole completion, tool turns included, and each model turn
  may take what is left; a tool turn that would pass that bound, or bring prompt + completion to
  ``context_tokens``, is dropped and its row stops with the calls unrun (TRL rolls the results
  back); a turn cut by the bound is still parsed (its calls cannot run: no tool turn fits).
  Schedule ``turn_by_turn``: like TRL's loop, each round is one `engine.turns.generate_turns`
  call over the rows still going, in row order, each row's turn drawn from a stream seeded by its
  context (`engine.sampling.row_generators`); a `TurnCache` lets a row's next turn feed only the
  tool turn's ids. Training also keeps each turn's parsed message and the tool messages
  (``Trajectory.messages``: TRL's completion form, what the rewards read).

Ids are only ever concatenated: ``prompt_ids + completion_ids`` is exactly what the model saw.
Greedy decoding does not depend on the batch composition (up to float rounding); sampling draws
each trajectory from its own seeded streams, so it is reproducible and independent of the batch
(the global RNG state is left untouched).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from minimind_trl.conversation import task_prompt
from minimind_trl.engine.decode import DECODE_SLICE, MIN_SAVED_ROW_STEPS, DecodeRow, TurnCache, decode
from minimind_trl.engine.sampling import Sampling, row_generators
from minimind_trl.engine.turns import generate_turns
from minimind_trl.envs.environment import call_as_trl, environment_tools, make_environment_class
from minimind_trl.envs.protocol import (
    DEFAULT_MAX_TOOL_TURNS,
    MAX_TOOL_TURNS,
    MAX_TURN_TOKENS,
    TrajectoryRecord,
    is_error_observation,
    message_calls,
    message_malformed_calls,
    parse_model_turn,
    prompt_ids_for,
    recordable,
    reply_text,
    tool_turn_ids,
    turn_malformed_calls,
)
from minimind_trl.envs.registry import ToolRegistry

SCHEDULES = ("continuous", "turn_by_turn")
TurnEngine = Callable[[list[list[int]], list[int], list[int] | None], tuple[list[list[int]], list[list[float]]]]
"""One round of model turns: ``(contexts, budgets, row_keys) -> (ids, logprobs)`` per context."""


@dataclass(frozen=True)
class TurnRules:
    """How long a trajectory may grow (module docstring). Evaluation sets ``turn_tokens`` (new
    ids per model turn); training sets ``completion_tokens`` (the whole completion, TRL's
    ``max_completion_length``) and ``context_tokens`` (prompt + completion stay below it: the
    model's ``max_position_embeddings``). ``max_tool_turns``: tool rounds per trajectory."""

    max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS
    turn_tokens: int | None = None
    completion_tokens: int | None = None
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.turn_tokens is None) == (self.completion_tokens is None):
            raise ValueError("TurnRules: set exactly one of turn_tokens (evaluation) and completion_tokens (training)")
        if not 0 <= self.max_tool_turns <= MAX_TOOL_TURNS:
            raise ValueError(f"TurnRules: max_tool_turns must be in [0, {MAX_TOOL_TURNS}], got {self.max_tool_turns}")
        for name in ("turn_tokens", "completion_tokens"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_TURN_TOKENS:
                raise ValueError(f"TurnRules: {name} must be in [1, {MAX_TURN_TOKENS}], got {value}")

    @property
    def training(self) -> bool:
        """TRL's tool-loop rules: one budget for the whole completion."""
        return self.completion_tokens is not None

    def first_budget(self) -> int:
        return self.completion_tokens if self.training else self.turn_tokens

    def next_budget(self, completion_length: int) -> int:
        """New ids the next model turn may take, its completion holding ``completion_length`` ids."""
        return self.completion_tokens - completion_length if self.training else self.turn_tokens

    def tool_turn_fits(self, prompt_length: int, completion_length: int) -> bool:
        """Whether a completion of ``completion_length`` ids (the tool turn included) may go on."""
        if not self.training:
            return True
        return (completion_length <= self.completion_tokens
                and (self.context_tokens is None or prompt_length + completion_length < self.context_tokens))


@dataclass(kw_only=True)
class Trajectory(TrajectoryRecord):
    """One rollout of one prompt: a `TrajectoryRecord` with its tokens and texts.

    ``tools``: the tool schemas offered in the prompt (from the task's system message);
    ``prompt_ids`` [P] and ``completion_ids`` [C] (model turns and tool turns, concatenated);
    ``action_mask`` [C]: 1 on model tokens (each turn's ``<|im_end|>`` included), 0 on tool-turn
    tokens; ``logprobs`` [C]: each model token's sampling log-prob (0.0 on tool tokens and when
    greedy); ``text``: ``completion_ids`` decoded with special tokens kept; ``turn_texts``: each
    model turn decoded without its ``<|im_end|>``; ``messages`` (training): the completion as
    TRL's tool loop builds it, each model turn's parsed message and the tool messages.
    """

    task_index: int
    sample_index: int
    task_id: Any
    open_thinking: bool
    tools: list[dict] | None
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    turn_texts: list[str] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)

    @property
    def final_reply(self) -> str:
        """The last turn's reply (after ``</think>``, stripped) when finished, else ``""``."""
        return reply_text(self.turn_texts[-1]).strip() if self.finished else ""


@dataclass
class _Turns:
    """What `_take_turn` needs besides the trajectory: the tokenizer, the registry's tools as
    TRL's loop calls them, the parse schemas and the rules."""

    tokenizer: Any
    rules: TurnRules
    schemas: list[dict]
    tools: dict[str, Any]
    environment: Any

    @classmethod
    def of(cls, tokenizer: Any, registry: ToolRegistry, rules: TurnRules) -> _Turns:
        environment = make_environment_class(registry)()
        return cls(tokenizer, rules, registry.schemas(), environment_tools(environment), environment)

    def call(self, call: dict) -> tuple[str, str]:
        """(name, observation) of one parsed call, as TRL 1.16's loop runs it."""
        if call.get("type", "function") != "function":
            return str(call.get("name", "unknown")), str({"error": f"Unsupported tool call type: {call['type']}"})
        function = call.get("function", call)
        self.environment.reset()  # keeps its call log from growing over a rollout
        return function["name"], call_as_trl(self.tools, function["name"], function["arguments"])


def task_prompt_ids(tokenizer: Any, task: dict, open_thinking: bool,
                    default_tools: list[dict] | None = None) -> tuple[list[dict] | None, list[int]]:
    """``(tools, prompt_ids)`` of a task row: the tools on its system message (None when it has
    none) and its prompt rendered with them, or with ``default_tools`` when it has none (training
    offers the registry's), plus the generation prompt and the think opener."""
    messages, tools = task_prompt(task)
    return tools, prompt_ids_for(tokenizer, messages, tools or default_tools, open_thinking)


def _take_turn(traj: Trajectory, context: list[int], ids: list[int], logps: list[float],
               turns: _Turns) -> list[int] | None:
    """Record one model turn (``ids`` generated after ``context``, ``logps`` their sampling
    log-probs); run its calls and append the tool turn. Returns the tool turn's ids when the row
    goes on to another turn, else None (module docstring: the rules of each regime)."""
    tokenizer, rules = turns.tokenizer, turns.rules
    if not ids:  # training: a tool turn filled the budget; TRL records no message
        traj.truncated = True
        return None
    eos = tokenizer.eos_token_id
    ended = ids[-1] == eos
    text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    turn = traj.n_turns
    traj.completion_ids += ids
    traj.action_mask += [1] * len(ids)
    traj.logprobs += logps
    traj.n_model_tokens += len(ids)
    traj.turn_texts.append(text)
    traj.n_turns += 1
    traj.truncated = not ended
    if not ended and not rules.training:
        return None
    fallback = tokenizer.decode(ids, skip_special_tokens=True) if rules.training else text  # TRL's plain-text read
    message = parse_model_turn(tokenizer, ids, context, turns.schemas, fallback)
    if rules.training:
        traj.messages.append(message)
    calls = message_calls(message)
    traj.tool_calls += [{"turn": turn, "name": recordable(c.get("name")), "arguments": recordable(c.get("arguments"))}
                        for c in calls]
    if not calls:
        traj.malformed_calls += message_malformed_calls(message) if rules.training else \
            turn_malformed_calls(text, read_as_text=True)
        traj.finished = ended
        return None
    traj.malformed_calls += message_malformed_calls(message)  # what TRL left beside the calls
    if not ended:  # training: cut by the budget; no tool turn fits after it
        return None
    if turn >= rules.max_tool_turns:
        traj.pending_call = True
        return None
    names, observations = zip(*(turns.call(c) for c in message.get("tool_calls")))
    suffix = tool_turn_ids(tokenizer, list(names), list(observations), traj.open_thinking)
    if not rules.tool_turn_fits(len(traj.prompt_ids), len(traj.completion_ids) + len(suffix)):
        traj.pending_call = True  # TRL rolls the tool results back; the calls stay unrun
        return None
    traj.observations += observations
    failed = sum(is_error_observation(o) for o in observations)
    traj.failed_calls += failed
    traj.valid_calls += len(observations) - failed
    if rules.training:
        traj.messages += [{"role": "tool", "name": n, "content": o} for n, o in zip(names, observations)]
    traj.completion_ids += suffix
    traj.action_mask += [0] * len(suffix)
    traj.logprobs += [0.0] * len(suffix)
    return suffix


def drive(model: Any, tokenizer: Any, trajectories: list[Trajectory], registry: ToolRegistry, rules: TurnRules,
          sampling: Sampling, *, schedule: str, stream: str, row_keys: list[int] | None = None,
          eos_token_ids: list[int] | None = None, batch_size: int = 32, decode_slice: int = DECODE_SLICE,
          min_saved_row_steps: int = MIN_SAVED_ROW_STEPS, turn_engine: TurnEngine | None = None,
          progress: bool = False) -> None:
    """Run every trajectory (its ``prompt_ids`` set, nothing generated yet) to its end, in place.

    ``schedule``: ``continuous`` (evaluation) or ``turn_by_turn`` (training; module docstring).
    ``stream`` and ``row_keys`` seed the sampling streams (`engine.sampling.row_generators`; row
    keys only with ``turn_by_turn``). ``eos_token_ids``: the ids that end a turn (default: the
    tokenizer's eos). ``batch_size``: rows decoded together (``turn_by_turn``: each round's rows).
    ``turn_engine`` (``turn_by_turn``): what generates a round of turns; default
    `engine.turns.generate_turns` on ``model`` with the rollout's `TurnCache`.
    The model must be in eval mode with whole weights and no grad (the caller's job)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"drive: schedule must be one of {SCHEDULES}, got {schedule!r}")
    turns = _Turns.of(tokenizer, registry, rules)
    eos_token_ids = [tokenizer.eos_token_id] if eos_token_ids is None else list(eos_token_ids)
    bar = tqdm(total=len(trajectories), desc="rollout", unit="traj") if progress else None
    try:
        if schedule == "continuous":
            _continuous(model, trajectories, turns, sampling, stream, eos_token_ids, batch_size, decode_slice,
                        min_saved_row_steps, bar)
        else:
            if turn_engine is None:
                cache = TurnCache()

                def turn_engine(contexts, budgets, keys):
                    return generate_turns(model, contexts, budgets, eos_token_ids, tokenizer.pad_token_id, sampling,
                                          stream=stream, batch_size=max(len(contexts), 1), decode_slice=decode_slice,
                                          cache=cache, min_saved_row_steps=min_saved_row_steps,
                                          return_logprobs=True, row_keys=keys)
            _turn_by_turn(trajectories, turns, row_keys, turn_engine)
    finally:
        if bar is not None:
            bar.close()
    for traj in trajectories:
        traj.text = tokenizer.decode(traj.completion_ids, skip_special_tokens=False)


def _continuous(model, trajectories, turns, sampling, stream, eos_token_ids, batch_size, decode_slice,
                min_saved_row_steps, bar) -> None:
    device = next(model.parameters()).device
    generators = row_generators([traj.prompt_ids for traj in trajectories], sampling, stream, device)
    rows = [DecodeRow(traj, list(traj.prompt_ids), turns.rules.first_budget(), generator)
            for traj, generator in zip(trajectories, generators)]

    def end_turn(row: DecodeRow) -> list[int] | None:
        tool_turn = _take_turn(row.owner, row.context, row.turn_ids, row.turn_logps, turns)
        if tool_turn is None and bar is not None:
            bar.update(1)
        return tool_turn

    decode(model, rows, end_turn, eos_token_ids=eos_token_ids, pad_token_id=turns.tokenizer.pad_token_id,
           sampling=sampling, batch_size=batch_size, decode_slice=decode_slice,
           min_saved_row_steps=min_saved_row_steps, record_logprobs=sampling.do_sample)


def _turn_by_turn(trajectories, turns, row_keys, turn_engine) -> None:
    going = list(range(len(trajectories)))
    contexts = [list(traj.prompt_ids) for traj in trajectories]
    budgets = [turns.rules.first_budget()] * len(trajectories)
    for _ in range(turns.rules.max_tool_turns + 1):
        ids, logps = turn_engine(contexts, budgets, None if row_keys is None else [row_keys[r] for r in going])
        next_rows = []
        for r, context, new, new_logps in zip(going, contexts, ids, logps):
            if _take_turn(trajectories[r], context, new, new_logps, turns) is not None:
                next_rows.append(r)
        going = next_rows
        if not going:
            return
        contexts = [trajectories[r].prompt_ids + trajectories[r].completion_ids for r in going]
        budgets = [turns.rules.next_budget(len(trajectories[r].completion_ids)) for r in going]


def rollout(model: Any, tokenizer: Any, tasks: list[dict], registry: ToolRegistry,
            max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS, max_new_tokens: int = 256,
            batch_size: int = 32, do_sample: bool = False, temperature: float = 1.0,
            num_samples: int = 1, open_thinking: bool = False, seed: int = 0,
            progress: bool = True, decode_slice: int = DECODE_SLICE,
            min_saved_row_steps: int = MIN_SAVED_ROW_STEPS) -> list[Trajectory]:
    """Evaluation: roll out every task ``num_samples`` times; returns the trajectories task-major
    (task 0 samples 0..n-1, task 1, ...). ``tasks`` are data-contract rows (``conversations``
    with the tools on the system message; ``id`` optional). ``max_new_tokens`` is per turn;
    ``batch_size`` rows decode together, at most ``decode_slice`` tokens per ``generate`` call
    (fewer when the rows whose turn ended would waste ``min_saved_row_steps``: `SliceStop`).
    Sampling (``do_sample``) draws each trajectory from its own stream, seeded by ``seed``, its
    prompt and its sample index (`engine.sampling.row_generators`)."""
    if not 0 <= max_tool_turns <= MAX_TOOL_TURNS or not 1 <= max_new_tokens <= MAX_TURN_TOKENS \
            or min(batch_size, num_samples, decode_slice) < 1:
        raise ValueError(f"rollout: need max_tool_turns in [0, {MAX_TOOL_TURNS}], max_new_tokens in "
                         f"[1, {MAX_TURN_TOKENS}] and batch_size, num_samples, decode_slice >= 1")
    trajectories = []
    for t, task in enumerate(tasks):
        tools, prompt = task_prompt_ids(tokenizer, task, open_thinking)
        trajectories += [Trajectory(task_index=t, sample_index=s, task_id=task.get("id"),
                                    open_thinking=open_thinking, tools=tools, prompt_ids=list(prompt))
                         for s in range(num_samples)]
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=0, top_p=1.0, seed=seed)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            drive(model, tokenizer, trajectories, registry, TurnRules(max_tool_turns, turn_tokens=max_new_tokens),
                  sampling, schedule="continuous", stream="eval", batch_size=batch_size, decode_slice=decode_slice,
                  min_saved_row_steps=min_saved_row_steps, progress=progress)
    finally:
        model.train(was_training)
    return trajectories
