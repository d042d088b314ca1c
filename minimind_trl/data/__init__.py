"""Agent-math data: task generation, gold SFT trajectories, audited splits and manifests.

* :mod:`~minimind_trl.data.generator` -- ``generate_tasks(num_tasks, seed, ...)``;
* :mod:`~minimind_trl.data.gold` -- ``gold_trajectory(task, registry)``;
* :mod:`~minimind_trl.data.formats` -- ``row_messages(conversations)``, ``row_task_prompt(task)``
  (the schema of :mod:`minimind_trl.conversation`, errors naming file and line);
* :mod:`~minimind_trl.data.splits` -- ``prepare_splits(...)``, ``load_splits(folder)``;
* :mod:`~minimind_trl.data.manifest` -- ``verify_manifest`` (``sha256_file``, ``write_json_atomic``
  and the errors ``DataError``, ``DataFormatError`` come from :mod:`minimind_trl.fsio`);
* :mod:`~minimind_trl.data.validation` -- ``validate_task_row``.
"""

from minimind_trl.conversation import encode_tool_calls
from minimind_trl.data.formats import row_messages, row_task_prompt, row_tool_calls
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.data.manifest import verify_manifest
from minimind_trl.data.splits import load_splits, normalize_task_row, prepare_splits
from minimind_trl.data.validation import GenerationError, validate_task_row
from minimind_trl.fsio import DataError, DataFormatError, sha256_file, write_json_atomic, write_jsonl_atomic

__all__ = [
    "DataError", "DataFormatError", "GenerationError", "row_messages", "row_tool_calls",
    "encode_tool_calls", "generate_tasks", "gold_trajectory", "load_splits", "normalize_task_row",
    "prepare_splits", "sha256_file", "validate_task_row", "verify_manifest", "write_json_atomic",
    "row_task_prompt", "write_jsonl_atomic",
]
