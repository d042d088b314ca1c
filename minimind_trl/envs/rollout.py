"""Batched multi-turn tool rollout for evaluation and benchmarks, independent of the trainer.

`rollout(model, tokenizer, tasks, registry, ...)` follows the same protocol as TRL's tool loop
(see `minimind_trl.envs.environment`; the shared ids, parse and call rules live in
`minimind_trl.envs.protocol`), so evaluation scores what training produced:

1. Each task's prompt (`minimind_trl.conversation.task_prompt`: tools from the system message,
   trailing empty assistant placeholders dropped) is rendered by the chat template with the
   generation prompt and the think prefix (`protocol.prompt_ids_for`).
2. The engine's decode loop (`minimind_trl.engine.decode`) runs up to ``batch_size`` rows over
   one KV cache, ``decode_slice`` tokens per ``generate`` call at most: rows that stop make room
   for queued ones, the cache keeps every row's context across turns (later turns feed only the
   new tool-turn ids), and prompts are encoded without repeats. A row's turn ends at its first
   ``<|im_end|>`` (eos 2), which belongs to the turn; this module's ``end_turn`` handles it.
3. The turn is parsed exactly as TRL's loop parses it (`protocol.parse_model_turn`:
   ``trl.chat_template_utils.parse_response`` with the tokenizer's ``response_template`` and the
   registry's schemas, which also cast string arguments to the schema types; a reply with any
   malformed ``<tool_call>`` block is plain text, its blocks counted by
   `protocol.turn_malformed_calls`). Its calls run as TRL's loop runs them in training
   (`environment.call_as_trl` on the registry's environment: a tool's failure is its
   ``{"error": ...}`` JSON observation, an unknown tool or non-object arguments TRL's ``{'error': ...}`` repr).
   The tool turn ``\\n<|im_start|>user\\n<tool_response>\\n{obs}\\n</tool_response><|im_end|>\\n
   <|im_start|>assistant\\n`` + think prefix is rendered by the template and appended as ids
   (`protocol.tool_turn_ids`).
4. Rows with calls continue, the others drop out; after ``max_tool_turns`` tool rounds a row
   that still calls tools stops with ``pending_call``. A turn without ``<|im_end|>`` within
   ``max_new_tokens`` (a per-turn budget) stops its row as ``truncated``; its calls are not run.

Ids are only ever concatenated: ``prompt_ids + completion_ids`` is exactly what the model saw.
Greedy decoding does not depend on the batch composition (up to float rounding); sampling draws
each trajectory from its own seeded stream, so it is reproducible and independent of the batch
(the global RNG state is left untouched).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from minimind_trl.conversation import task_prompt
from minimind_trl.engine.decode import DECODE_SLICE, MIN_SAVED_ROW_STEPS, DecodeRow, decode
from minimind_trl.engine.sampling import Sampling, row_generators
from minimind_trl.envs.environment import call_as_trl, environment_tools, make_environment_class
from minimind_trl.envs.protocol import (
    DEFAULT_MAX_TOOL_TURNS,
    MAX_TOOL_TURNS,
    MAX_TURN_TOKENS,
    TrajectoryRecord,
    is_error_observation,
    message_malformed_calls,
    parse_model_turn,
    prompt_ids_for,
    recordable,
    reply_text,
    tool_turn_ids,
    turn_malformed_calls,
)
from minimind_trl.envs.registry import ToolRegistry


@dataclass(kw_only=True)
class Trajectory(TrajectoryRecord):
    """One evaluation rollout of one task: a `TrajectoryRecord` with its tokens and texts.

    ``tools``: the tool schemas offered in the prompt (from the task's system message);
    ``prompt_ids`` [P] and ``completion_ids`` [C] (model turns and tool turns, concatenated);
    ``action_mask`` [C]: 1 on model tokens (each turn's ``<|im_end|>`` included), 0 on tool-turn
    tokens; ``text``: ``completion_ids`` decoded with special tokens kept; ``turn_texts``: each
    model turn decoded without its ``<|im_end|>``.
    """

    task_index: int
    sample_index: int
    task_id: Any
    open_thinking: bool
    tools: list[dict] | None
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    text: str = ""
    turn_texts: list[str] = field(default_factory=list)

    @property
    def final_reply(self) -> str:
        """The last turn's reply (after ``</think>``, stripped) when finished, else ``""``."""
        return reply_text(self.turn_texts[-1]).strip() if self.finished else ""


def _take_turn(traj: Trajectory, context: list[int], ids: list[int], tokenizer: Any,
               call_tool: Any, schemas: list[dict], turn: int, max_tool_turns: int) -> list[int] | None:
    """Record one model turn (``ids`` generated after ``context``); run its calls
    (``call_tool(name, arguments) -> observation``) and append the tool turn. Returns the tool
    turn's ids when the row goes on to another turn, else None."""
    eos = tokenizer.eos_token_id
    ended = bool(ids) and ids[-1] == eos
    text = tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=False)
    traj.completion_ids += ids
    traj.action_mask += [1] * len(ids)
    traj.n_model_tokens += len(ids)
    traj.turn_texts.append(text)
    traj.n_turns += 1
    if not ended:
        traj.truncated = True
        return None
    message = parse_model_turn(tokenizer, ids, context, schemas, text)
    calls = [c.get("function", c) for c in message.get("tool_calls") or []]
    traj.tool_calls += [{"turn": turn, "name": recordable(c["name"]), "arguments": recordable(c["arguments"])}
                        for c in calls]
    if not calls:
        traj.malformed_calls += turn_malformed_calls(text, read_as_text=True)
        traj.finished = True
        return None
    traj.malformed_calls += message_malformed_calls(message)  # what TRL left beside the calls
    if turn >= max_tool_turns:
        traj.pending_call = True
        return None
    observations = [call_tool(c["name"], c["arguments"]) for c in calls]
    traj.observations += observations
    failed = sum(is_error_observation(o) for o in observations)
    traj.failed_calls += failed
    traj.valid_calls += len(observations) - failed
    suffix = tool_turn_ids(tokenizer, [c["name"] for c in calls], observations, traj.open_thinking)
    traj.completion_ids += suffix
    traj.action_mask += [0] * len(suffix)
    return suffix


def rollout(model: Any, tokenizer: Any, tasks: list[dict], registry: ToolRegistry,
            max_tool_turns: int = DEFAULT_MAX_TOOL_TURNS, max_new_tokens: int = 256,
            batch_size: int = 32, do_sample: bool = False, temperature: float = 1.0,
            num_samples: int = 1, open_thinking: bool = False, seed: int = 0,
            progress: bool = True, decode_slice: int = DECODE_SLICE,
            min_saved_row_steps: int = MIN_SAVED_ROW_STEPS) -> list[Trajectory]:
    """Roll out every task ``num_samples`` times; returns the trajectories task-major
    (task 0 samples 0..n-1, task 1, ...). ``tasks`` are data-contract rows (``conversations``
    with the tools on the system message; ``id`` optional). ``max_new_tokens`` is per turn;
    ``batch_size`` rows decode together, at most ``decode_slice`` tokens per ``generate`` call
    (fewer when the rows whose turn ended would waste ``min_saved_row_steps``: `SliceStop`).
    Sampling (``do_sample``) draws each trajectory from its own stream, seeded by ``seed``, its
    prompt and its sample index (`engine.sampling.row_generators`), as training does."""
    if not 0 <= max_tool_turns <= MAX_TOOL_TURNS or not 1 <= max_new_tokens <= MAX_TURN_TOKENS \
            or min(batch_size, num_samples, decode_slice) < 1:
        raise ValueError(f"rollout: need max_tool_turns in [0, {MAX_TOOL_TURNS}], max_new_tokens in "
                         f"[1, {MAX_TURN_TOKENS}] and batch_size, num_samples, decode_slice >= 1")
    trajectories = []
    for t, task in enumerate(tasks):
        messages, tools = task_prompt(task)
        prompt = prompt_ids_for(tokenizer, messages, tools, open_thinking)
        trajectories += [Trajectory(task_index=t, sample_index=s, task_id=task.get("id"),
                                    open_thinking=open_thinking, tools=tools, prompt_ids=list(prompt))
                         for s in range(num_samples)]
    sampling = Sampling(do_sample=do_sample, temperature=temperature, top_k=0, top_p=1.0, seed=seed)
    device = next(model.parameters()).device
    generators = row_generators([traj.prompt_ids for traj in trajectories], sampling, "eval", device)
    rows = [DecodeRow(traj, list(traj.prompt_ids), max_new_tokens, generator)
            for traj, generator in zip(trajectories, generators)]
    bar = tqdm(total=len(trajectories), desc="rollout", unit="traj") if progress else None
    end_turn = _turn_ender(tokenizer, registry, max_tool_turns, bar)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            decode(model, rows, end_turn, eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
                   sampling=sampling, batch_size=batch_size, decode_slice=decode_slice,
                   min_saved_row_steps=min_saved_row_steps)
    finally:
        model.train(was_training)
        if bar is not None:
            bar.close()
    for traj in trajectories:
        traj.text = tokenizer.decode(traj.completion_ids, skip_special_tokens=False)
    return trajectories


def _turn_ender(tokenizer: Any, registry: ToolRegistry, max_tool_turns: int, bar: Any):
    """The decode loop's ``end_turn`` for evaluation: record the turn (`_take_turn`), run its calls
    with the tools as training's loop calls them, and hand back the tool turn's ids (the row goes
    on) or None (it is done)."""
    schemas = registry.schemas()
    environment = make_environment_class(registry)()
    tools = environment_tools(environment)

    def call_tool(name: str, arguments: Any) -> str:
        environment.reset()  # keeps its call log from growing over an evaluation
        return call_as_trl(tools, name, arguments)

    def end_turn(row: DecodeRow) -> list[int] | None:
        traj: Trajectory = row.owner
        tool_turn = _take_turn(traj, row.context, row.turn_ids, tokenizer, call_tool, schemas, traj.n_turns,
                               max_tool_turns)
        if tool_turn is None and bar is not None:
            bar.update(1)
        return tool_turn

    return end_turn
