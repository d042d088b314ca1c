"""The corpus of the shipped default tokenizer: project data plus general text.

* Agent-math gold trajectories from the task generator, rendered through the chat template
  (system turn with the tools preamble, question, tool calls, tool responses, final answer), so
  the template's pieces, tool names, units and question phrasings become cheap tokens.
* General English and Chinese prose written for this project (``general_text.txt``, shipped with
  the tokenizer package), so ordinary text also tokenizes sensibly.

The corpus lives with the data it renders (the tokenizer package needs nothing from data, tools
or the generator). `scripts/build_default_tokenizer.py` writes these documents to a JSONL file
and trains on it.
"""

from __future__ import annotations

from importlib import resources

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.tokenization.builder import render_conversation

GENERAL_TEXT_PACKAGE = "minimind_trl.tokenization"
GENERAL_TEXT_FILE = "general_text.txt"


def general_text() -> str:
    """The project's own general English/Chinese prose."""
    return resources.files(GENERAL_TEXT_PACKAGE).joinpath(GENERAL_TEXT_FILE).read_text(encoding="utf-8")


def task_documents(num_tasks: int, seed: int) -> list[str]:
    """Rendered gold trajectories of ``num_tasks`` generated agent-math tasks."""
    registry = default_registry()
    documents = []
    for task in generate_tasks(num_tasks, seed):
        row = gold_trajectory(task, registry)
        documents.append(render_conversation(row["conversations"], f"gold trajectory of task {task['id']}"))
    return documents


def default_corpus(num_tasks: int, seed: int, general_repeats: int) -> list[str]:
    """Task renderings followed by the general text, repeated ``general_repeats`` times (its weight)."""
    paragraphs = [p.strip() + "\n" for p in general_text().split("\n\n") if p.strip()]
    return task_documents(num_tasks, seed) + paragraphs * general_repeats
