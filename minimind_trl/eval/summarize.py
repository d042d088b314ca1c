"""Summarise several eval folders: per-metric tables against a baseline with paired bootstrap
CIs, the 2x2 interaction, two-level (seed, question) CIs, provenance and failure cases.

Conditions come as ``path`` (name = folder name) or ``name=path``; a name ``cond@seed`` marks one
training seed of condition ``cond``. All folders must come from the same frozen split (same
split name and manifest SHA256) and cover exactly the same question ids.

For each metric and condition X (seed-averaged per-question vector x, baseline y):

* ``mean`` = mean_q x_q, ``ci`` = question bootstrap of mean(x);
* ``diff`` = mean(x) - mean(y), ``diff_ci`` = paired question bootstrap of x - y;
* when X or the baseline has several seeds: ``ci_two_level`` / ``diff_ci_two_level`` from
  :func:`~minimind_trl.eval.stats.two_level_bootstrap_ci` (seeds per cell, then questions).

Every bootstrap uses the same ``seed`` (common random numbers across comparisons) and
``n_resamples`` (default 10,000), percentile 95 % intervals; see :mod:`minimind_trl.eval.stats`.
Writing the files is :mod:`minimind_trl.eval.report`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minimind_trl.eval import stats
from minimind_trl.eval.errors import (
    EvalError,
    EvalFolderError,
    QuestionSetMismatchError,
    SplitMismatchError,
)
from minimind_trl.eval.folder import EvalFolder
from minimind_trl.eval.metrics import REQUIRED_RECORD_KEYS, available_metrics, per_question_values
from minimind_trl.fsio import DataFormatError, iter_jsonl_objects, read_json_file

INTERACTION_CELLS = ("zscore_seqmean", "zscore_fixedL", "center_seqmean", "center_fixedL")
INTERACTION_WEIGHTS = (1.0, -1.0, -1.0, 1.0)  # (D - C) - (B - A) = A - B - C + D


@dataclass
class EvalRun:
    """One eval folder: a (condition, seed) pair with its records aligned by question id."""

    condition: str
    seed: str
    path: Path
    manifest: dict
    metrics: dict
    records: list[dict] = field(repr=False)


def parse_condition_spec(spec: str) -> tuple[str, str, Path]:
    """``"name@seed=path"`` / ``"name=path"`` / ``"path"`` → (condition, seed label, path)."""
    if "=" in spec:
        label, _, path = spec.partition("=")
    else:
        path = spec
        label = Path(spec.rstrip("/\\")).name
    if not label or not path:
        raise EvalError(f"bad condition {spec!r}: use PATH or NAME=PATH (NAME may be cond@seed)")
    condition, _, seed = label.partition("@")
    if not condition:
        raise EvalError(f"bad condition name in {spec!r}")
    return condition, seed or "0", Path(path)


def _record_problem(rec: dict) -> tuple[str, str] | None:
    """(field, what it must be) for the first record value summaries cannot use, else None."""
    def count(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
        return "id", "must be a string or an integer"
    for key in ("success", "all_gt_covered"):
        if not isinstance(rec[key], bool):
            return key, "must be true or false"
    hits = rec["gt_hits"]
    if not isinstance(hits, list) or not hits or not all(isinstance(h, bool) for h in hits):
        return "gt_hits", "must be a non-empty list of true/false"
    for key in ("n_tool_calls", "answer_length"):
        if not count(rec[key]):
            return key, "must be a non-negative integer"
    pass_at_k = rec.get("pass_at_k")
    if pass_at_k is not None and not (isinstance(pass_at_k, dict) and all(
            k.isdigit() and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
            for k, v in pass_at_k.items())):
        return "pass_at_k", "must map each k to a number in [0, 1]"
    return None


def _read_records(file: Path) -> list[dict]:
    records, seen = [], {}
    for line, rec in iter_jsonl_objects(file):
        missing = [k for k in REQUIRED_RECORD_KEYS if k not in rec]
        if missing:
            raise DataFormatError(file, line, missing[0],
                                  f"is missing (a record needs {', '.join(REQUIRED_RECORD_KEYS)})")
        problem = _record_problem(rec)
        if problem:
            raise DataFormatError(file, line, *problem)
        if str(rec["id"]) in seen:
            raise DataFormatError(file, line, "id",
                                  f"{rec['id']!r} repeats line {seen[str(rec['id'])]} (duplicate question id)")
        seen[str(rec["id"])] = line
        records.append(rec)
    return records


def _read_manifest(file: Path) -> dict:
    manifest = read_json_file(file)
    if not isinstance(manifest, dict):
        raise DataFormatError(file, None, "<json>", "must be a JSON object")
    split = manifest.get("split")
    if not isinstance(split, dict) or not isinstance(split.get("manifest_sha256"), str):
        raise DataFormatError(file, None, "split.manifest_sha256", "is missing or not a string")
    if not isinstance(split.get("name"), (str, type(None))):
        raise DataFormatError(file, None, "split.name", "must be a string")
    if not isinstance(manifest.get("checkpoint", {}), dict):
        raise DataFormatError(file, None, "checkpoint", "must be an object")
    return manifest


def load_eval_folder(condition: str, seed: str, path: Path) -> EvalRun:
    """Read records.jsonl, eval_manifest.json and metrics.json (:class:`EvalFolder`) through the
    package's bounded readers; every record's summary fields are type-checked (errors name file,
    line and field)."""
    if not path.is_dir():
        raise EvalFolderError(f"eval folder not found: {path}")
    folder = EvalFolder(path)
    for file in (folder.records_path, folder.manifest_path):
        if not file.is_file():
            raise EvalFolderError(f"{path} is not an eval folder: missing {file.name}")
    metrics_file = folder.metrics_path
    try:
        records = _read_records(folder.records_path)
        manifest = _read_manifest(folder.manifest_path)
        metrics = read_json_file(metrics_file) if metrics_file.is_file() else {}
        if not isinstance(metrics, dict):
            raise DataFormatError(metrics_file, None, "<json>", "must be a JSON object")
    except DataFormatError as exc:
        raise EvalFolderError(str(exc)) from None
    except OSError as exc:
        raise EvalFolderError(f"cannot read eval folder {path}: {exc}") from None
    if not records:
        raise EvalFolderError(f"{folder.records_path} holds no records")
    records = sorted(records, key=lambda r: str(r["id"]))
    return EvalRun(condition, seed, path, manifest, metrics, records)


def check_compatible(runs: list[EvalRun]) -> None:
    """Same split (name and manifest hash) and same question ids in every run, else raise."""
    ref = runs[0]
    ref_split = ref.manifest["split"]
    for run in runs[1:]:
        split = run.manifest["split"]
        if split["manifest_sha256"] != ref_split["manifest_sha256"] or split.get("name") != ref_split.get("name"):
            raise SplitMismatchError(
                f"{run.path} was evaluated on split {split.get('name')!r} "
                f"(manifest {split['manifest_sha256'][:12]}) but {ref.path} on "
                f"{ref_split.get('name')!r} (manifest {ref_split['manifest_sha256'][:12]})"
            )
    ref_ids = [str(r["id"]) for r in ref.records]
    for run in runs[1:]:
        ids = [str(r["id"]) for r in run.records]
        if ids != ref_ids:
            only_run = sorted(set(ids) - set(ref_ids))[:3]
            only_ref = sorted(set(ref_ids) - set(ids))[:3]
            raise QuestionSetMismatchError(
                f"{run.path} and {ref.path} cover different questions "
                f"({len(ids)} vs {len(ref_ids)}; only in the first: {only_run}, only in the second: {only_ref})"
            )


def _group(runs: list[EvalRun]) -> dict[str, list[EvalRun]]:
    groups: dict[str, list[EvalRun]] = {}
    for run in runs:
        groups.setdefault(run.condition, []).append(run)
    for name, members in groups.items():
        seeds = [r.seed for r in members]
        if len(set(seeds)) != len(seeds):
            raise EvalError(f"condition {name!r} lists seed(s) more than once: {seeds}")
        members.sort(key=lambda r: (len(r.seed), r.seed))
    return groups


def _matrix(members: list[EvalRun], metric: str) -> np.ndarray:
    return np.stack([per_question_values(r.records, metric) for r in members])


def _ci(res: stats.BootstrapResult) -> list[float]:
    return [res.low, res.high]


def summarize(
    specs: list[str],
    baseline: str = "sft",
    interaction: dict[str, str] | None = None,
    n_resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
    confidence: float = stats.DEFAULT_CONFIDENCE,
    num_failures: int = 5,
) -> tuple[dict, list[dict]]:
    """Build the summary dict and the failure rows (nothing is written)."""
    if not specs:
        raise EvalError("summarize needs at least one eval folder")
    runs = [load_eval_folder(*parse_condition_spec(s)) for s in specs]
    check_compatible(runs)
    groups = _group(runs)
    if baseline not in groups:
        raise EvalError(f"baseline {baseline!r} is not among the conditions {sorted(groups)}")
    if interaction is not None:
        missing = [c for c in INTERACTION_CELLS if c not in interaction]
        unknown = [v for v in interaction.values() if v not in groups]
        if missing or unknown or len(interaction) != 4:
            raise EvalError(
                f"--interaction needs the four cells {list(INTERACTION_CELLS)} mapped to conditions "
                f"{sorted(groups)}; missing cells {missing}, unknown conditions {unknown}"
            )
    names = list(groups)
    metric_names = [m for m in available_metrics(runs[0].records)
                    if all(m in available_metrics(r.records) for r in runs)]
    boot = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)

    table: dict[str, dict[str, dict]] = {}
    for metric in metric_names:
        mats = {name: _matrix(groups[name], metric) for name in names}
        base = mats[baseline]
        rows = {}
        for name in names:
            x = mats[name]
            own = stats.bootstrap_mean_ci(x.mean(axis=0), **boot)
            row = {"mean": own.estimate, "ci": _ci(own), "n_seeds": x.shape[0],
                   "per_seed": [float(v) for v in x.mean(axis=1)]}
            if x.shape[0] > 1:
                row["ci_two_level"] = _ci(stats.two_level_bootstrap_ci([x], [1.0], **boot))
            if name == baseline:
                row.update(diff=0.0, diff_ci=None)
            else:
                diff = stats.paired_difference_ci(x.mean(axis=0), base.mean(axis=0), **boot)
                row.update(diff=diff.estimate, diff_ci=_ci(diff))
                if x.shape[0] > 1 or base.shape[0] > 1:
                    row["diff_ci_two_level"] = _ci(stats.two_level_bootstrap_ci([x, base], [1.0, -1.0], **boot))
            rows[name] = row
        table[metric] = rows

    inter = None
    if interaction is not None:
        inter = {"cells": dict(interaction),
                 "formula": "(center_fixedL - center_seqmean) - (zscore_fixedL - zscore_seqmean)", "metrics": {}}
        for metric in metric_names:
            cells = [_matrix(groups[interaction[c]], metric) for c in INTERACTION_CELLS]
            q = stats.interaction_ci(*(m.mean(axis=0) for m in cells), **boot)
            entry = {"value": q.estimate, "ci": _ci(q)}
            if any(m.shape[0] > 1 for m in cells):
                entry["ci_two_level"] = _ci(stats.two_level_bootstrap_ci(cells, INTERACTION_WEIGHTS, **boot))
            inter["metrics"][metric] = entry

    split = runs[0].manifest["split"]
    summary = {
        "format": "minimind-trl-summary/1",
        "baseline": baseline,
        "split": {"name": split.get("name"), "manifest_sha256": split["manifest_sha256"]},
        "n_questions": len(runs[0].records),
        "bootstrap": {
            **boot,
            "method": "percentile",
            "scheme": "rng = numpy.random.default_rng(seed); idx = rng.integers(0, n, size=(n_resamples, n)); "
                      "mean of the per-question vector over each row; paired = same rows for both conditions",
            "two_level_scheme": "per cell rng.integers(0, S_c, size=(n_resamples, S_c)) seed draws, then shared "
                                "question draws as above",
        },
        "conditions": {
            name: {
                "seeds": {r.seed: {"path": str(r.path),
                                   "checkpoint_sha256": r.manifest.get("checkpoint", {}).get("sha256"),
                                   "metrics": r.metrics} for r in groups[name]},
            }
            for name in names
        },
        "metrics": table,
        "interaction": inter,
    }
    return summary, _failures(groups, num_failures, seed)


def _failures(groups: dict[str, list[EvalRun]], num_failures: int, seed: int) -> list[dict]:
    """Up to ``num_failures`` unsuccessful records per (condition, seed), drawn with a fixed seed."""
    rows = []
    rng = np.random.default_rng(seed)
    for name, members in groups.items():
        for run in members:
            wrong = [r for r in run.records if not r["success"]]
            take = rng.choice(len(wrong), size=min(num_failures, len(wrong)), replace=False) if wrong else []
            for i in sorted(int(j) for j in take):
                r = wrong[i]
                rows.append({
                    "condition": name, "seed": run.seed, "id": r["id"], "question": r.get("question"),
                    "gt": r.get("gt"), "gt_hits": r["gt_hits"], "final_answer": r.get("final_answer"),
                    "n_tool_calls": r["n_tool_calls"], "text": r.get("text"),
                })
    return rows
