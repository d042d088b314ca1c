"""Frozen evaluation of one checkpoint on one split (``minimind-trl eval``).

Pipeline: resolve and hash the checkpoint (:mod:`.checkpoints`), read the split's rows through the
data package's bounded reader (file hashes and row counts checked against its manifest, every row
checked as ``data prepare`` does: errors name file, line and field), roll every question out **greedily**
through the same tool environment (`minimind_trl.envs.rollout.rollout`; the tools of the run that
trained the checkpoint, when it comes from a run folder, see :func:`run_tools`, else the built-ins)
and score it with the same verifier as the training reward
(`minimind_trl.rewards.evaluate_completion` on the completion text). Optionally sample
``num_samples`` trajectories per question at ``temperature`` and report the unbiased pass@k.

Output folder (must not exist or be empty, and no input of the evaluation; locked while it is
written; built beside it and committed whole, see :mod:`.folder`):

* ``records.jsonl`` — one record per question, in split order (keys: see :func:`build_record`;
  with pass@k also ``samples`` = {n, num_correct, temperature, successes} and ``pass_at_k`` =
  {"k": value});
* ``metrics.json`` — the local `evaluate` module's numbers (:mod:`.metrics`), plus ``pass@k``;
* ``eval_manifest.json`` — checkpoint SHA256 (weights), tokenizer SHA256, split name and split
  manifest SHA256, decoding settings, package and library versions, SHA256 of the two files above.

No time stamps are recorded: evaluating the same checkpoint twice gives identical files.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import datasets
import evaluate
import torch
import transformers

from minimind_trl import __version__
from minimind_trl.data.manifest import verify_manifest
from minimind_trl.data.splits import read_split
from minimind_trl.envs.protocol import MAX_TOOL_TURNS, MAX_TURN_TOKENS
from minimind_trl.envs.rollout import rollout
from minimind_trl.envs.tools import run_registry
from minimind_trl.eval.errors import EvalError, OutputDirNotEmptyError
from minimind_trl.eval.folder import EVAL_MANIFEST, METRICS, OUTPUTS, RECORDS
from minimind_trl.eval.metrics import METRIC_DIR, compute_metrics
from minimind_trl.eval.stats import pass_at_k
from minimind_trl.fsio import (
    DataError,
    DataFormatError,
    build_directory,
    folder_lock,
    sha256_file,
    write_json_atomic,
    write_jsonl_atomic,
)
from minimind_trl.modeling.checkpoints import (
    CheckpointInfo,
    check_tokenizer_fits,
    load_checkpoint_tokenizer,
    load_model,
    resolve_checkpoint,
)
from minimind_trl.rewards import evaluate_completion, prompt_question
from minimind_trl.run_folder import RunFolder
from minimind_trl.targets import OutputTargetError, TargetNotEmptyError, check_output_folder

MANIFEST_FORMAT = "minimind-trl.eval/1"
MAX_EVAL_BATCH = 4096
"""Upper bound of ``--batch-size`` (rows decoded together; the protocol's evaluations use 16 to 64)."""
MAX_SAMPLES = 1024
"""Upper bound of ``--num-samples`` (sampled trajectories per question for pass@k)."""


# Rows decoded together by default. On CPU a wider batch is slower, not faster: the KV cache's
# per-step copies (growth, row selection, repeat_kv) scale with batch x length while the small
# model's matmuls gain nothing past ~25 rows. All 600 demo test questions, 2 threads, records
# identical at every width: 25 rows 54 s, 50 rows 85 s, 100 rows 135 s, 150 rows 167 s
# (benchmarks/cpu_speed.py --parts eval; benchmarks/README.md).
EVAL_BATCH_SIZE = 25


@dataclass(frozen=True)
class EvalSettings:
    """Decoding and sampling settings (recorded in the manifest)."""

    batch_size: int = EVAL_BATCH_SIZE  # rows decoded together (continuous batching; see envs.rollout)
    max_new_tokens: int = 256  # per assistant turn
    max_tool_turns: int = 3
    open_thinking: bool = False
    pass_k: tuple[int, ...] = ()  # empty: no sampling
    num_samples: int = 8
    temperature: float = 0.8
    sample_seed: int = 0
    limit: int | None = None
    tools: tuple[str, ...] = ()  # tool plugins beyond the built-ins (a run's rollout.tools)
    tool_names: tuple[str, ...] | None = None  # the tools offered (a run's rollout.tool_names); None: all

    def validate(self, prefix: str = "") -> None:
        """Every setting in its range, else one :class:`EvalError` naming the option (``--{prefix}NAME``:
        the sweep passes ``eval-``) and its bound."""
        _check_int(self.batch_size, 1, MAX_EVAL_BATCH, f"--{prefix}batch-size")
        _check_int(self.max_new_tokens, 1, MAX_TURN_TOKENS, f"--{prefix}max-new-tokens")
        _check_int(self.max_tool_turns, 0, MAX_TOOL_TURNS, f"--{prefix}max-tool-turns")
        _check_int(self.num_samples, 1, MAX_SAMPLES, f"--{prefix}num-samples")
        if self.limit is not None:
            _check_int(self.limit, 1, None, f"--{prefix}limit")
        if self.pass_k:
            if min(self.pass_k) < 1 or max(self.pass_k) > self.num_samples:
                raise EvalError(f"pass@k needs 1 <= k <= --num-samples ({self.num_samples}); "
                                f"got k = {list(self.pass_k)}")
            if not math.isfinite(self.temperature) or self.temperature <= 0:
                raise EvalError(f"sampling needs a finite --temperature > 0, got {self.temperature}")


def _check_int(value, low: int, high: int | None, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise EvalError(f"{option} must be an int {span}, got {value!r}")


def build_record(task: dict, traj) -> dict:
    """The JSONL record of one greedy trajectory, verified as the training reward does.

    Keys: id, question, gt, n_gt, op_type, lang, difficulty; text (completion: model and tool
    turns, special tokens kept), turn_texts, final_answer, tool_calls [{turn, name, arguments}],
    observations; n_tool_calls (well-formed calls, pending ones included), valid_calls,
    failed_calls, malformed_calls; gt_hits, gt_coverage, all_gt_covered, success, tool_backed;
    num_turns, finished, pending_call, truncated; prompt_length, completion_length (tokens,
    observations included), answer_length (model tokens = sum of the action mask),
    final_answer_chars.
    """
    gt = list(task["gt"])
    meta = task.get("meta") or {}
    question = prompt_question(task["conversations"])
    view, ver = evaluate_completion(traj.text, gt, question=question)
    return {
        "id": str(task["id"]),
        "question": question,
        "gt": gt,
        "n_gt": len(gt),
        "op_type": meta.get("op_type") or "unknown",
        "lang": meta.get("lang"),
        "difficulty": meta.get("difficulty"),
        "text": traj.text,
        "turn_texts": list(traj.turn_texts),
        "final_answer": view.final_answer,
        "tool_calls": [dict(c) for c in traj.tool_calls],
        "observations": list(traj.observations),
        "n_tool_calls": len(traj.tool_calls),
        "valid_calls": traj.valid_calls,
        "failed_calls": traj.failed_calls,
        "malformed_calls": traj.malformed_calls,
        "gt_hits": [bool(h) for h in ver.gt_hits],
        "gt_coverage": float(ver.gt_coverage),
        "all_gt_covered": bool(ver.all_gt_covered),
        "success": bool(ver.success),
        "tool_backed": bool(ver.tool_backed),
        "num_turns": traj.n_turns,
        "finished": bool(traj.finished),
        "pending_call": bool(traj.pending_call),
        "truncated": bool(traj.truncated),
        "prompt_length": len(traj.prompt_ids),
        "completion_length": len(traj.completion_ids),
        "answer_length": int(traj.n_model_tokens),
        "final_answer_chars": len(view.final_answer),
    }


def evaluate_tasks(model, tokenizer, tasks: list[dict], settings: EvalSettings, registry=None,
                   progress: bool = True) -> list[dict]:
    """Greedy records for ``tasks`` (plus sampled pass@k when ``settings.pass_k``)."""
    settings.validate()
    if registry is None:
        try:
            registry = run_registry(settings.tools, settings.tool_names)
        except (ValueError, ImportError, OSError) as error:
            raise EvalError(f"tools: {error}") from None
    common = dict(max_tool_turns=settings.max_tool_turns, max_new_tokens=settings.max_new_tokens,
                  batch_size=settings.batch_size, open_thinking=settings.open_thinking, progress=progress)
    greedy = rollout(model, tokenizer, tasks, registry, do_sample=False, num_samples=1, **common)
    records = [build_record(task, traj) for task, traj in zip(tasks, greedy)]
    if settings.pass_k:
        n = settings.num_samples
        sampled = rollout(model, tokenizer, tasks, registry, do_sample=True, temperature=settings.temperature,
                          num_samples=n, seed=settings.sample_seed, **common)
        for i, (task, record) in enumerate(zip(tasks, records)):
            question = prompt_question(task["conversations"])
            successes = [bool(evaluate_completion(t.text, list(task["gt"]), question=question)[1].success)
                         for t in sampled[i * n:(i + 1) * n]]
            c = sum(successes)
            record["samples"] = {"n": n, "num_correct": c, "temperature": settings.temperature, "successes": successes}
            record["pass_at_k"] = {str(k): pass_at_k(n, c, k) for k in settings.pass_k}
    return records


def load_split_tasks(split_dir: str | os.PathLike, split: str) -> tuple[list[dict], dict]:
    """(task rows of ``split``, split info for the manifest); file hashes checked first."""
    folder = Path(split_dir)
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        raise EvalError(f"{folder} is not a split folder (no manifest.json)")
    try:
        tasks = read_split(folder, split, verify_manifest(folder))
    except (DataError, ValueError, OSError) as exc:
        message = str(exc) if isinstance(exc, DataFormatError) else f"cannot load split folder {folder}: {exc}"
        raise EvalError(message) from None
    if not tasks:
        raise EvalError(f"split {split!r} is empty or missing in {folder}")
    ids = [row.get("id") for row in tasks]
    if any(i is None for i in ids) or len(set(ids)) != len(ids):
        raise EvalError(f"{folder}/{split}.jsonl: every task needs a unique id for paired statistics")
    info = {"dir": str(folder), "name": split, "manifest_sha256": sha256_file(manifest),
            "file_sha256": sha256_file(folder / f"{split}.jsonl"), "num_questions": len(tasks)}
    return tasks, info


def _check_output_dir(output_dir: Path, sources: tuple = ()) -> None:
    """The output must be new or empty and no input of the evaluation (:mod:`minimind_trl.targets`)."""
    try:
        check_output_folder(output_dir, sources=sources)
    except TargetNotEmptyError:
        raise OutputDirNotEmptyError(f"output folder {output_dir} is not empty (evaluation never overwrites "
                                     "results)") from None
    except OutputTargetError as exc:
        raise EvalError(str(exc)) from None


def _versions() -> dict:
    return {"minimind_trl": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "datasets": datasets.__version__, "evaluate": evaluate.__version__}


def run_tools(checkpoint: str | os.PathLike) -> tuple[tuple[str, ...], tuple[str, ...] | None] | None:
    """(``rollout.tools``, ``rollout.tool_names``) of the GRPO run whose folder holds ``checkpoint``
    (``RUN/final`` or a ``RUN/checkpoint-N``, by the run's ``manifest.json``:
    :meth:`RunFolder.tool_setup`), else None."""
    run = RunFolder.of_checkpoint(checkpoint)
    if run is None:
        return None
    try:
        setup = run.tool_setup()
    except (DataFormatError, OSError) as error:
        raise EvalError(f"{run.manifest_path}: not a readable run manifest ({error})") from None
    return None if setup is None else (setup.plugins, setup.tool_names)


def with_run_tools(settings: EvalSettings, checkpoint: str | os.PathLike) -> EvalSettings:
    """``settings`` with the tools of the run that trained ``checkpoint`` (:func:`run_tools`) when
    neither ``tools`` nor ``tool_names`` was given explicitly (explicit settings win)."""
    trained_with = run_tools(checkpoint)
    if trained_with is None or settings.tools or settings.tool_names is not None:
        return settings
    return replace(settings, tools=trained_with[0], tool_names=trained_with[1])


def resolve_device(name: str, option: str = "--device") -> str:
    """``auto`` → ``cuda`` when this torch build sees a GPU, else ``cpu``; any other name must be a
    device this torch can use (else a one-line EvalError naming ``option``, not a traceback from the
    first tensor)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as exc:
        raise EvalError(f"{option} {name!r} is not a torch device ({str(exc).splitlines()[0]})") from None
    usable = {"cpu": lambda: True, "cuda": torch.cuda.is_available,
              "mps": lambda: torch.backends.mps.is_available()}.get(device.type, lambda: False)
    if not usable():
        raise EvalError(f"{option} {name!r} is not usable here: torch {torch.__version__} "
                        f"({'no CUDA in this build' if torch.version.cuda is None else 'no visible GPU'}); "
                        f"use {option} auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise EvalError(f"{option} {name!r}: only {torch.cuda.device_count()} GPU(s) visible")
    return name


def run_evaluation(checkpoint: str | os.PathLike, split_dir: str | os.PathLike, output_dir: str | os.PathLike,
                   split: str = "test", preset: str | None = None, tokenizer_path: str | os.PathLike | None = None,
                   settings: EvalSettings = EvalSettings(), device: str = "auto", progress: bool = True,
                   allow_tokenizer_mismatch: bool = False) -> Path:
    """Evaluate ``checkpoint`` on ``split`` of ``split_dir``; write the output folder; return it.

    The output folder must be new or empty and no input (the checkpoint, the split folder, a folder
    above them); it is locked for the whole evaluation, so a second evaluation into it is refused
    (:class:`~minimind_trl.fsio.FolderInUseError`) instead of sharing its staging folder."""
    out = Path(output_dir)
    _check_output_dir(out, (checkpoint, split_dir))
    settings.validate()
    with folder_lock(out, "minimind-trl eval"):
        return _evaluate_into(out, checkpoint, split_dir, split, preset, tokenizer_path, settings, device, progress,
                              allow_tokenizer_mismatch)


def _evaluate_into(out: Path, checkpoint, split_dir, split: str, preset, tokenizer_path, settings: EvalSettings,
                   device: str, progress: bool, allow_tokenizer_mismatch: bool) -> Path:
    """:func:`run_evaluation` with the output folder checked and locked."""
    device = resolve_device(device)
    settings = with_run_tools(settings, checkpoint)
    info: CheckpointInfo = resolve_checkpoint(checkpoint, preset)
    tasks, split_info = load_split_tasks(split_dir, split)
    if settings.limit is not None:
        tasks = tasks[: settings.limit]
    tokenizer, tokenizer_source, tokenizer_sha = load_checkpoint_tokenizer(info, tokenizer_path,
                                                                           allow_tokenizer_mismatch)
    model = load_model(info, device)
    check_tokenizer_fits(model, tokenizer, info.path)

    records = evaluate_tasks(model, tokenizer, tasks, settings, progress=progress)
    metrics = compute_metrics(records, settings.pass_k)

    _check_output_dir(out)  # nothing appeared meanwhile
    with build_directory(out) as staging:  # the folder appears complete or not at all
        _write_outputs(staging, records, metrics, _manifest(info, tokenizer_source, tokenizer_sha, split_info,
                                                           len(tasks), settings, device))
    return out


def _write_outputs(folder: Path, records: list[dict], metrics: dict, manifest: dict) -> None:
    """records.jsonl, metrics.json, then eval_manifest.json with their SHA-256."""
    write_jsonl_atomic(folder / RECORDS, records, sort_keys=True, compact=False)
    write_json_atomic(folder / METRICS, metrics, sort_keys=True)
    write_json_atomic(folder / EVAL_MANIFEST, {**manifest, "outputs": {name: sha256_file(folder / name)
                                                                       for name in OUTPUTS}}, sort_keys=True)


def _manifest(info: CheckpointInfo, tokenizer_source: str | None, tokenizer_sha: str, split_info: dict,
              evaluated: int, settings: EvalSettings, device: str) -> dict:
    """The eval manifest without its ``outputs`` (filled in by :func:`_write_outputs`)."""
    sampling_only = ("pass_k", "num_samples", "temperature", "sample_seed")
    decoding = {"greedy": True, "dtype": "float32", "device": device,
                **{k: v for k, v in asdict(settings).items() if k not in sampling_only}}
    return {
        "format": MANIFEST_FORMAT,
        "created_by": "minimind-trl eval",
        "package_version": _versions()["minimind_trl"],
        "checkpoint": info.to_dict(),
        "tokenizer": {"path": tokenizer_source, "sha256": tokenizer_sha},
        "split": {**split_info, "evaluated": evaluated},
        "decoding": decoding,
        "pass_at_k": None if not settings.pass_k else {
            "k": list(settings.pass_k), "num_samples": settings.num_samples, "temperature": settings.temperature,
            "seed": settings.sample_seed, "top_k": 0, "top_p": 1.0,
            "estimator": "1 - C(n-c, k) / C(n, k), averaged over questions"},
        "metric_module": METRIC_DIR.name,
        "versions": _versions(),
    }
