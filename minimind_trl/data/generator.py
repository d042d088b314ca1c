"""Agent-math task generator: questions whose answers need 1-3 tool calls, with exact ground truth.

Each task row follows the upstream ``agent_rl_math.jsonl`` layout plus ``id`` and ``meta``::

    {"id": "t-…", "conversations": [{"role": "system", "content": …, "tools": "<JSON list>"},
                                    {"role": "user", "content": question},
                                    {"role": "assistant", "content": ""}],
     "gt": ["42", …], "meta": {"op_type", "n_gt", "lang", "difficulty", "calls"}}

``len(gt)`` is the number of tool calls the question needs, one GT value per call, in order.
``meta.calls`` is the reference solution as an upstream ``tool_calls`` string (``[{"name",
"arguments"}]``); :func:`minimind_trl.data.gold.gold_trajectory` replays it.

Operation types, difficulty tiers and exactness rules: see :mod:`minimind_trl.data.questions`.
Independent sub-questions become parallel calls in one gold turn; chain steps are called in
sequence.

Every GT value is computed twice: exactly with ``Fraction`` and by calling the tool through the
registry; the two must agree, or generation stops with :class:`GenerationError`.

Tools offered: the tools the question needs plus 0-``max_distractors`` (default 2) distractors
drawn from the rest of the registry, in a shuffled order. Strata (n_gt, op_type) are drawn in
shuffled rounds, so they stay balanced; language and difficulty are drawn uniformly. Questions
are unique (after normalisation). Some cells have few distinct questions (a one-value exchange
rate question is one of ~110 currency pairs): a (stratum, language, difficulty) cell that yields
no new question in ``MAX_ATTEMPTS`` draws is retired, then a stratum with no cell left, so large
runs stay balanced over the strata that still have questions. Everything comes from one
``random.Random(seed)``: the same arguments give the same rows.
"""

from __future__ import annotations

import json
import random

from minimind_trl.conversation import encode_tool_calls
from minimind_trl.data import templates as T
from minimind_trl.data.normalize import canonical_tools_json, normalize_text, row_id_for
from minimind_trl.data.questions import MAX_ATTEMPTS, Call, Part, build_question
from minimind_trl.data.strata import OP_TYPES
from minimind_trl.data.validation import GenerationError
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import DataError

DIFFICULTIES = ("easy", "medium", "hard")
LANGS = ("zh", "en")
__all__ = ["DIFFICULTIES", "LANGS", "generate_tasks", "strata_for"]


def _tool_value(registry, call: Call) -> str:
    """Run the call through the registry; its result must equal the exact GT text."""
    observation = json.loads(registry.call(call.name, call.arguments))
    if observation.get("result") != call.gt:
        raise GenerationError(f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)}) returned "
                              f"{observation}, but the exact value is {call.gt}")
    return observation["result"]


def strata_for(op_types=OP_TYPES, n_gt_values=(1, 2, 3)) -> list[tuple[int, str]]:
    """The (n_gt, op_type) strata a generator run covers (no one-step chains)."""
    return [(n, op) for n in n_gt_values for op in op_types if not (op == "chain" and n < 2)]


def generate_tasks(
    num_tasks: int,
    seed: int,
    *,
    registry=None,
    op_types: tuple[str, ...] = OP_TYPES,
    n_gt_values: tuple[int, ...] = (1, 2, 3),
    langs: tuple[str, ...] = LANGS,
    difficulties: tuple[str, ...] = DIFFICULTIES,
    max_distractors: int = 2,
) -> list[dict]:
    """``num_tasks`` distinct task rows (module docstring), deterministic in ``seed``."""
    unknown = [op for op in op_types if op not in OP_TYPES]
    if (unknown or not set(n_gt_values) <= {1, 2, 3} or not set(langs) <= set(LANGS)
            or not set(difficulties) <= set(DIFFICULTIES)):
        raise DataError(f"unsupported generator options: op_types={op_types}, n_gt_values={n_gt_values}, "
                        f"langs={langs}, difficulties={difficulties}")
    strata = strata_for(op_types, n_gt_values)
    if num_tasks < 0 or (num_tasks and not strata):
        raise DataError(f"cannot generate {num_tasks} tasks from strata {strata}")
    registry = registry or default_registry()
    rng = random.Random(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    exhausted: set[tuple] = set()
    cycle: list[tuple[int, str]] = []
    while len(rows) < num_tasks:
        if not cycle:
            cycle = [stratum for stratum in strata if stratum not in exhausted]
            if not cycle:
                raise GenerationError(f"every stratum ran out of new questions after {len(rows)} tasks")
            rng.shuffle(cycle)
        n_gt, op_type = stratum = cycle.pop()
        drawn = _new_question(rng, stratum, langs, difficulties, seen, exhausted)
        if drawn is None:
            exhausted.add(stratum)
            continue
        part, question, lang, difficulty = drawn
        seen.add(question)
        gt = [_tool_value(registry, call) for call in part.calls]
        rows.append(_row(rng, registry, part, question, gt, op_type, lang, difficulty, max_distractors))
    return rows


def _new_question(rng, stratum, langs, difficulties, seen, exhausted):
    """(part, normalised question, lang, difficulty) not in ``seen``, or None when the stratum is
    exhausted. A (stratum, lang, difficulty) cell that yields no new question in
    ``MAX_ATTEMPTS`` draws is marked exhausted and another cell is tried."""
    n_gt, op_type = stratum
    cells = [(lang, level) for lang in langs for level in difficulties if (stratum, lang, level) not in exhausted]
    while cells:
        lang, difficulty = rng.choice(cells)
        for _ in range(MAX_ATTEMPTS):
            part = build_question(rng, op_type, n_gt, lang, difficulty)
            question = normalize_text(part.question)
            if question not in seen:
                return part, question, lang, difficulty
        exhausted.add((stratum, lang, difficulty))
        cells.remove((lang, difficulty))
    return None


def _row(rng, registry, part: Part, question: str, gt: list[str], op_type: str, lang: str, difficulty: str,
         max_distractors: int) -> dict:
    needed = list(dict.fromkeys(call.name for call in part.calls))
    spare = sorted(name for name in registry.names() if name not in needed)
    offered = needed + rng.sample(spare, min(len(spare), rng.randint(0, max_distractors)))
    rng.shuffle(offered)
    conversations = [
        {"role": "system", "content": normalize_text(rng.choice(T.SYSTEM_PROMPTS[lang])),
         "tools": canonical_tools_json(registry.schemas(offered))},
        {"role": "user", "content": question},
        {"role": "assistant", "content": ""},
    ]
    calls = [{"name": call.name, "arguments": call.arguments} for call in part.calls]
    meta = {"op_type": op_type, "n_gt": len(gt), "lang": lang, "difficulty": difficulty,
            "calls": encode_tool_calls(calls)}
    return {"id": row_id_for(conversations), "conversations": conversations, "gt": gt, "meta": meta}
