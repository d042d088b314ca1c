"""Gold SFT trajectories: replay a task's reference calls through the tools and write the answer.

Output rows use the upstream SFT schema: ``{"id": task id, "conversations": [system (with tools),
user, assistant (content "", ``tool_calls`` JSON string), tool (the real observation), ...,
assistant (final answer)]}``. Independent sub-questions are called together in one assistant
turn (parallel calls, one tool message per call, in call order); a ``chain`` task calls its steps
one turn at a time. Either way there is exactly one call per GT value and at most
:data:`MAX_TOOL_TURNS` tool turns. The final answer is in the question's language and restates
every value exactly as the tool wrote it (``"12 + 30 = 42"``, ``"5 km = 5000 m"``,
``"1 USD = 7.2 CNY"``); its wording is picked from the id's hash, so it is deterministic.
"""

from __future__ import annotations

import json

from minimind_trl.conversation import encode_tool_calls, prompt_turns
from minimind_trl.data import templates as T
from minimind_trl.data.formats import row_tool_calls
from minimind_trl.data.validation import validate_task_row
from minimind_trl.fsio import DataError, DataFormatError, iter_jsonl, sha256_text

MAX_TOOL_TURNS = 3


def _number(value) -> str:
    return str(value) if isinstance(value, int) or not float(value).is_integer() else str(int(value))


def call_phrase(call: dict, value: str) -> str:
    """One call restated with its result, e.g. ``"12 + 30 = 42"``."""
    args = call["arguments"]
    if call["name"] == "calculate_math":
        return f"{args['expression']} = {value}"
    if call["name"] == "unit_converter":
        return f"{_number(args['value'])} {args['from_unit']} = {value} {args['to_unit']}"
    if call["name"] == "get_exchange_rate":
        return f"1 {args['from_currency']} = {value} {args['to_currency']}"
    return f"{call['name']}: {value}"


def final_answer(task_id: str, lang: str, op_type: str, calls: list[dict], values: list[str]) -> str:
    """The closing assistant message stating every value."""
    pick = int(sha256_text(task_id)[:8], 16)
    phrases = [call_phrase(call, value) for call, value in zip(calls, values)]
    separator = T.ITEM_SEPARATOR[lang]
    if op_type == "chain":
        templates = T.FINAL_CHAIN[lang]
        return templates[pick % len(templates)].format(items=separator.join(phrases), last=values[-1])
    if len(phrases) == 1:
        templates = T.FINAL_SINGLE[lang]
        return templates[pick % len(templates)].format(items=phrases[0])
    templates = T.FINAL_MULTI[lang]
    items = separator.join(f"({index}) {phrase}" for index, phrase in enumerate(phrases, start=1))
    return templates[pick % len(templates)].format(items=items)


def gold_trajectory(task: dict, registry) -> dict:
    """The SFT row solving ``task`` (a generated task row with ``meta.calls``)."""
    validate_task_row(task)
    task_id = task.get("id") or "<no id>"
    meta = task.get("meta") or {}
    if not meta.get("calls"):
        raise DataError(f"task {task_id}: no reference calls (meta.calls); gold trajectories need generated tasks")
    calls = row_tool_calls(meta["calls"], "meta.calls")
    gt = [str(value) for value in task["gt"]]
    if len(calls) != len(gt):
        raise DataError(f"task {task_id}: {len(calls)} reference calls but {len(gt)} GT values")
    groups = [[call] for call in calls] if meta.get("op_type") == "chain" else [calls]
    if len(groups) > MAX_TOOL_TURNS:
        raise DataError(f"task {task_id}: needs {len(groups)} tool turns, more than {MAX_TOOL_TURNS}")
    conversations, values = prompt_turns(task["conversations"]), []
    for group in groups:
        conversations.append({"role": "assistant", "content": "", "tool_calls": encode_tool_calls(group)})
        for call in group:
            observation = registry.call(call["name"], call["arguments"])
            result = json.loads(observation).get("result")
            if result is None:
                raise DataError(f"task {task_id}: {call['name']} returned {observation}")
            conversations.append({"role": "tool", "content": observation})
            values.append(result)
    if values != gt:
        raise DataError(f"task {task_id}: the tools now return {values}, the task's gt is {gt}")
    lang = meta.get("lang", "en")
    answer = final_answer(task_id, lang, meta.get("op_type", ""), calls, values)
    conversations.append({"role": "assistant", "content": answer})
    return {"id": task_id, "conversations": conversations}


def gold_file_rows(path: str, registry) -> list[dict]:
    """Gold trajectories for every task of a JSONL file; errors name the file and line."""
    rows = []
    for line, task in iter_jsonl(path):
        try:
            rows.append(gold_trajectory(task, registry))
        except DataFormatError as exc:
            raise DataFormatError(path, line, exc.field, exc.reason) from None
        except DataError as exc:
            raise DataError(f"{path}:{line}: {exc}") from None
    if not rows:
        raise DataError(f"{path}: no rows (the file is empty or blank)")
    return rows
