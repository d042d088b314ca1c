"""Summarise several eval folders: per-metric tables against a baseline with paired bootstrap
CIs, the 2x2 interaction, two-level (seed, question) CIs, provenance and failure cases.

Conditions come as ``path`` (name = folder name) or ``name=path``; a name ``cond@seed`` marks one
training seed of condition ``cond``. All folders must come from the same frozen split (same
split name and manifest SHA256) and cover exactly the same question ids.

For each metric and condition X (seed-averaged per-question vector x, baseline y):

* ``mean`` = mean_q x_q, ``ci`` = question bootstrap of mean(x);
* ``diff`` = mean(x) - mean(y), ``diff_ci`` = paired question bootstrap of x - y;
* when X or the baseline has several seeds: ``ci_two_level`` / ``diff_ci_two_level`` from
  :func:`~minimind_trl.eval.stats.two_level_bootstrap_ci` (seeds per cell, then questions);
* when X and the baseline hold the same several seeds: also ``diff_ci_matched`` /
  ``diff_se_matched`` / ``mde_matched`` from the seed-matched two-level bootstrap (one seed draw
  shared by both, then questions). A sweep's seed fixes the prompt order and the sampling stream of
  every condition alike (their first rollout is the same trajectories), so seed s of X and seed s of
  the baseline are a matched pair; the independent scheme ignores that pairing and is conservative
  when the pair's results are correlated. Both are reported;
* resolution: ``diff_se`` = std_0(x - y) / sqrt(n) and ``mde`` = (z_{1-alpha/2} + z_{power}) *
  ``diff_se``, the smallest difference the paired question comparison detects with 80 % power at
  alpha = 1 - confidence (0.05); ``diff_se_two_level`` / ``mde_two_level`` from the two-level
  bootstrap's standard error (:func:`~minimind_trl.eval.stats.minimum_detectable_effect`). On a
  binary metric (task success) each standard error is floored at ``sqrt(d / n)``, the value for a
  policy that moves with discordance d (``assumed_discordance``, default 0.08: the full demo's RL
  runs disagreed with their SFT start on 0.067-0.100 of the test questions), so two runs that
  barely differ never claim a fine resolution; ``mde_basis`` / ``mde_two_level_basis`` say whether
  the observed or the assumed discordance set it. A non-binary metric keeps the observed value (0
  when the compared runs agree on every question: "not measured", not infinite resolution).

With ``interaction`` (the four cells of the Dr.GRPO 2x2, A = z-score/sequence mean, B = z-score/
fixed L, C = centred/sequence mean, D = centred/fixed L): the interaction ``(D - C) - (B - A)`` and
the two main effects, ``advantage`` = (C + D)/2 - (A + B)/2 and ``reduction`` = (B + D)/2 -
(A + C)/2, each with its question CI, resolution and (several seeds) two-level and matched CIs.

Tables: every metric of :func:`~minimind_trl.eval.metrics.available_metrics` held by every run
(``sampled_pass@1`` and pass@k only when every run was sampled, at one temperature, else
:class:`SamplingMismatchError`), then each :data:`~minimind_trl.eval.metrics.BY_N_GT_METRICS`
metric over the questions with k GT values, ``task_success[n_gt=k]``, for each k present (only
when there are several; the bootstrap resamples those questions only). ``fixed_broken`` counts,
per condition and seed, the questions the baseline fails and the run solves (fixed) and the
reverse (broken); against a baseline with several seeds, averaged over its seeds.

Every bootstrap uses the same ``seed`` (common random numbers across comparisons) and
``n_resamples`` (default 10,000), percentile 95 % intervals; see :mod:`minimind_trl.eval.stats`.
Writing the files is :mod:`minimind_trl.eval.report`.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minimind_trl.eval import stats
from minimind_trl.eval.errors import (
    EvalError,
    EvalFolderError,
    QuestionSetMismatchError,
    SamplingMismatchError,
    SplitMismatchError,
)
from minimind_trl.eval.folder import EVAL_MANIFEST, OUTPUTS, RECORDS, EvalFolder
from minimind_trl.eval.metrics import (
    BY_N_GT_METRICS,
    REQUIRED_RECORD_KEYS,
    available_metrics,
    n_gt,
    per_question_values,
    subset_metric_name,
)
from minimind_trl.fsio import DataFormatError, iter_jsonl_objects, read_json_file, sha256_file

INTERACTION_CELLS = ("zscore_seqmean", "zscore_fixedL", "center_seqmean", "center_fixedL")
INTERACTION_WEIGHTS = (1.0, -1.0, -1.0, 1.0)  # (D - C) - (B - A) = A - B - C + D
# The 2x2's main effects over the same cells (A, B, C, D): each factor's level averaged over the other's.
MAIN_EFFECTS = {
    "advantage": {"weights": (-0.5, -0.5, 0.5, 0.5),
                  "formula": "(center_seqmean + center_fixedL)/2 - (zscore_seqmean + zscore_fixedL)/2"},
    "reduction": {"weights": (-0.5, 0.5, -0.5, 0.5),
                  "formula": "(zscore_fixedL + center_fixedL)/2 - (zscore_seqmean + center_seqmean)/2"},
}
# fixed_broken counts per run (see _transitions)
TRANSITIONS = ("fixed", "broken", "net", "both_solved", "both_failed")
# One summary table: (table name, metric, question indices or None for all questions).
Table = tuple[str, str, np.ndarray | None]


@dataclass
class EvalRun:
    """One eval folder: a (condition, seed) pair with its records aligned by question id."""

    condition: str
    seed: str
    path: Path
    manifest: dict
    metrics: dict
    records: list[dict] = field(repr=False)
    temperature: float | None = None  # sampling temperature of `samples` / pass@k, None: not sampled
    unverified: bool = False  # summarised with --allow-unhashed: no hashes / count in its manifest


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


MAX_COUNT = 10**12
"""The largest count (tool calls, lengths, samples) a record may hold."""


def _record_problem(rec: dict) -> tuple[str, str] | None:
    """(field, what it must be) for the first record value summaries cannot use, else None."""
    def count(v):  # bounded: a 4000-digit integer is not a count (and overflows float)
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT

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
            return key, f"must be an integer in [0, {MAX_COUNT}]"
    if "n_gt" in rec and rec["n_gt"] != len(hits):
        return "n_gt", f"must equal the number of gt_hits ({len(hits)})"
    if isinstance(rec.get("gt"), list) and len(rec["gt"]) != len(hits):
        return "gt_hits", f"holds {len(hits)} hits for {len(rec['gt'])} GT values"
    if rec["all_gt_covered"] != all(hits):
        return "all_gt_covered", f"is {rec['all_gt_covered']} but gt_hits is {hits}"
    if rec["success"] != rec["all_gt_covered"]:
        return "success", f"is {rec['success']} but all_gt_covered is {rec['all_gt_covered']} (success = every GT hit)"
    coverage = rec.get("gt_coverage")
    if coverage is not None and (not _finite(coverage) or abs(coverage - sum(hits) / len(hits)) > 1e-9):
        return "gt_coverage", f"must be the share of gt_hits that are true ({sum(hits)}/{len(hits)})"
    if "malformed_calls" in rec and not count(rec["malformed_calls"]):
        return "malformed_calls", "must be a non-negative integer"
    samples = rec.get("samples")
    if samples is not None:
        if not (isinstance(samples, dict) and count(samples.get("n")) and samples["n"] >= 1
                and count(samples.get("num_correct")) and samples["num_correct"] <= samples["n"]):
            return "samples", "must hold n >= 1 and num_correct in [0, n]"
        temperature = samples.get("temperature")
        if temperature is not None and not (_finite(temperature) and temperature > 0):
            return "samples.temperature", "must be a finite number > 0 (the sampling temperature)"
    return _pass_at_k_problem(rec.get("pass_at_k"), samples)


def _finite(value) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


PASS_AT_K_KEY = re.compile(r"[1-9][0-9]{0,5}")
"""A pass@k key: k written as a positive integer without leading zeros (``"1"``, ``"10"``)."""


def _pass_at_k_problem(pass_at_k, samples) -> tuple[str, str] | None:
    """``pass_at_k`` maps each k (:data:`PASS_AT_K_KEY`, at most the samples drawn) to a number in [0, 1]."""
    if pass_at_k is None:
        return None
    n = samples.get("n") if isinstance(samples, dict) else None
    if not isinstance(pass_at_k, dict) or not all(
            PASS_AT_K_KEY.fullmatch(k) and (n is None or int(k) <= n) and _finite(v) and 0 <= v <= 1
            for k, v in pass_at_k.items()):
        most = "" if n is None else f" <= samples.n ({n})"
        return "pass_at_k", f"must map each k (a positive integer{most}) to a number in [0, 1]"
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
    sampling = manifest.get("pass_at_k")
    if isinstance(sampling, dict) and sampling.get("temperature") is not None \
            and not (_finite(sampling["temperature"]) and sampling["temperature"] > 0):
        raise DataFormatError(file, None, "pass_at_k.temperature", "must be a finite number > 0")
    return manifest


def _check_output_hashes(folder: EvalFolder, manifest: dict) -> list[str]:
    """Each file the manifest's ``outputs`` hashes still has that SHA-256: records edited or replaced
    after evaluation are refused, not summarised. ``outputs`` may name only the evaluation's own files
    (:data:`~minimind_trl.eval.folder.OUTPUTS`), each present; returns the own files it leaves
    unhashed (``records.jsonl`` always counts; ``metrics.json`` when it exists)."""
    outputs = manifest.get("outputs")
    if outputs is not None and not isinstance(outputs, dict):
        raise DataFormatError(folder.manifest_path, None, "outputs", "must map file names to SHA-256")
    outputs = outputs or {}
    for name, expected in outputs.items():
        if name not in OUTPUTS:
            raise DataFormatError(folder.manifest_path, None, f"outputs.{name}",
                                  f"is not a file an evaluation writes (only {', '.join(OUTPUTS)})")
        file = folder.path / name
        if not file.is_file():
            raise DataFormatError(folder.manifest_path, None, f"outputs.{name}",
                                  f"names {file}, which does not exist; re-run the evaluation")
        if sha256_file(file) != expected:
            raise DataFormatError(folder.manifest_path, None, f"outputs.{name}",
                                  f"{file} does not have the SHA-256 the evaluation recorded ({str(expected)[:12]}…): "
                                  "it was edited or replaced after evaluation; re-run the evaluation")
    return [name for name in OUTPUTS if name not in outputs and (name == RECORDS or (folder.path / name).exists())]


def _check_record_count(folder: EvalFolder, manifest: dict, records: list[dict]) -> bool:
    """The manifest's ``split.evaluated`` equals the number of records; False when it is not recorded."""
    evaluated = manifest["split"].get("evaluated")
    if evaluated is None:
        return False
    if isinstance(evaluated, bool) or not isinstance(evaluated, int) or evaluated != len(records):
        raise DataFormatError(folder.manifest_path, None, "split.evaluated",
                              f"is {evaluated!r} but {folder.records_path} holds {len(records)} records "
                              "(records were removed or added after evaluation)")
    return True


def _check_finite(path, value, field: str = "") -> None:
    """Every number in ``value`` (a parsed JSON document) is finite (Python's reader takes NaN and Infinity);
    the first one that is not, in document order, is named."""
    stack = [(value, field)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise DataFormatError(path, None, where or "<json>", f"is {item} (a summary needs finite numbers)")
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        stack.extend(reversed([(child, f"{where}.{key}" if where else str(key)) for key, child in children]))


def _unverified(path: Path, missing: list[str], allow_unhashed: bool) -> bool:
    """Refuse an eval folder whose manifest leaves ``missing`` unverified, or with ``allow_unhashed``
    warn loudly on stderr; returns whether it is unverified."""
    if not missing:
        return False
    what = " and ".join(missing)
    if not allow_unhashed:
        raise EvalFolderError(f"{path / EVAL_MANIFEST}: {what} not verified (no SHA-256 in its outputs, or no "
                              "split.evaluated count): re-run the evaluation, or pass --allow-unhashed to summarise "
                              "it anyway, marked unverified")
    print(f"WARNING: {path}: {what} NOT VERIFIED (the eval manifest records no SHA-256 / count for it); "
          "summarised because of --allow-unhashed and marked unverified in the summary", file=sys.stderr)
    return True


def load_eval_folder(condition: str, seed: str, path: Path, allow_unhashed: bool = False) -> EvalRun:
    """Read records.jsonl, eval_manifest.json and metrics.json (:class:`EvalFolder`) through the
    package's bounded readers; every record's summary fields are type-checked (errors name file,
    line and field), the files are checked against the manifest's ``outputs`` hashes and the records
    against its ``split.evaluated`` count. A folder whose manifest records neither is refused, or
    with ``allow_unhashed`` summarised, marked ``unverified``, with a warning on stderr."""
    if not path.is_dir():
        raise EvalFolderError(f"eval folder not found: {path}")
    folder = EvalFolder(path)
    for file in (folder.records_path, folder.manifest_path):
        if not file.is_file():
            raise EvalFolderError(f"{path} is not an eval folder: missing {file.name}")
    metrics_file = folder.metrics_path
    try:
        manifest = _read_manifest(folder.manifest_path)
        unhashed = _check_output_hashes(folder, manifest)
        records = _read_records(folder.records_path)
        counted = _check_record_count(folder, manifest, records)
        metrics = read_json_file(metrics_file) if metrics_file.is_file() else {}
        if not isinstance(metrics, dict):
            raise DataFormatError(metrics_file, None, "<json>", "must be a JSON object")
        _check_finite(metrics_file, metrics)
    except DataFormatError as exc:
        raise EvalFolderError(str(exc)) from None
    except OSError as exc:
        raise EvalFolderError(f"cannot read eval folder {path}: {exc}") from None
    if not records:
        raise EvalFolderError(f"{folder.records_path} holds no records")
    unverified = _unverified(path, [*unhashed, *([] if counted else ["the record count"])], allow_unhashed)
    records = sorted(records, key=lambda r: str(r["id"]))
    return EvalRun(condition, seed, path, manifest, metrics, records, _sampling_temperature(path, manifest, records),
                   unverified)


def _sampling_temperature(path: Path, manifest: dict, records: list[dict]) -> float | None:
    """The one temperature the folder's samples were drawn at (manifest ``pass_at_k`` and the records'
    ``samples``), None when it holds no samples; two different ones are an error."""
    found = {float(r["samples"]["temperature"]) for r in records
             if isinstance(r.get("samples"), dict) and r["samples"].get("temperature") is not None}
    sampling = manifest.get("pass_at_k")
    if isinstance(sampling, dict) and isinstance(sampling.get("temperature"), (int, float)):
        found.add(float(sampling["temperature"]))
    if len(found) > 1:
        raise EvalFolderError(f"{path}: samples drawn at several temperatures {sorted(found)}")
    return found.pop() if found else None


def check_compatible(runs: list[EvalRun]) -> None:
    """Same split (name and manifest hash), same question ids (with the same number of GT values)
    in every run, and, when every run was sampled, one sampling temperature; else raise."""
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
    ref_n_gt = [n_gt(r) for r in ref.records]
    for run in runs[1:]:
        differ = next((r["id"] for r, k in zip(run.records, ref_n_gt) if n_gt(r) != k), None)
        if differ is not None:
            raise QuestionSetMismatchError(
                f"question {differ!r} has a different number of GT values in {run.path} and {ref.path}")
    temperatures = {run.temperature for run in runs if run.temperature is not None}
    if len(temperatures) > 1 and all(_sampled(run) for run in runs):
        listing = ", ".join(f"{run.path}: {'unrecorded' if run.temperature is None else f'{run.temperature:g}'}"
                            for run in runs)
        raise SamplingMismatchError(
            f"sampled metrics compare runs sampled at one temperature; these were sampled at {listing}")


def _sampled(run: EvalRun) -> bool:
    """Whether the run's sampled metrics can be tabled: a known temperature, or samples in every record."""
    return run.temperature is not None or all("samples" in r or "pass_at_k" in r for r in run.records)


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


def _matrix(members: list[EvalRun], metric: str, questions: np.ndarray | None = None) -> np.ndarray:
    mat = np.stack([per_question_values(r.records, metric) for r in members])
    return mat if questions is None else mat[:, questions]


def _ci(res: stats.BootstrapResult) -> list[float]:
    return [res.low, res.high]


def _tables(runs: list[EvalRun], metric_names: list[str]) -> list[Table]:
    """Each metric over all questions, then each BY_N_GT_METRICS metric per number of GT values
    (when the questions have several)."""
    tables: list[Table] = [(m, m, None) for m in metric_names]
    counts = np.array([n_gt(r) for r in runs[0].records])
    ks = sorted(set(counts.tolist()))
    if len(ks) > 1:
        for metric in (m for m in BY_N_GT_METRICS if m in metric_names):
            tables += [(subset_metric_name(metric, k), metric, np.flatnonzero(counts == k)) for k in ks]
    return tables


def _matched(seed_lists: list[list[str]]) -> bool:
    """Whether cells hold the same several seeds (rows in the same order: :func:`_group` sorts them)."""
    return len(seed_lists[0]) > 1 and all(seeds == seed_lists[0] for seeds in seed_lists)


def _comparison_rows(mats: dict[str, np.ndarray], baseline: str, boot: dict, power: float,
                     discordance: float = 0.0, seeds: dict[str, list[str]] | None = None) -> dict[str, dict]:
    """One table: each condition's mean with its CIs, its difference to the baseline with its CIs and
    the smallest difference each comparison resolves (module docstring); on a binary metric each
    standard error is floored at :func:`~minimind_trl.eval.stats.discordance_floor_se` of
    ``discordance`` (``mde_basis`` says which one was used). ``seeds``: each condition's seed labels
    in row order; a condition with the baseline's several seeds also gets the seed-matched CI."""
    base = mats[baseline]
    binary = all(bool(np.isin(m, (0.0, 1.0)).all()) for m in mats.values())
    floor = stats.discordance_floor_se(base.shape[1], discordance) if binary else 0.0

    def mde(se: float) -> float:
        return stats.minimum_detectable_effect(max(se, floor), power, boot["confidence"])

    def basis(se: float) -> str:
        return "observed" if se >= floor else f"assumed discordance {discordance:g}"

    rows = {}
    for name, x in mats.items():
        own = stats.bootstrap_mean_ci(x.mean(axis=0), **boot)
        row = {"mean": own.estimate, "ci": _ci(own), "n_seeds": x.shape[0],
               "per_seed": [float(v) for v in x.mean(axis=1)]}
        if x.shape[0] > 1:
            row["ci_two_level"] = _ci(stats.two_level_bootstrap_ci([x], [1.0], **boot))
        if name == baseline:
            row.update(diff=0.0, diff_ci=None, diff_se=None, mde=None)
        else:
            diff = stats.paired_difference_ci(x.mean(axis=0), base.mean(axis=0), **boot)
            se = stats.mean_standard_error(x.mean(axis=0) - base.mean(axis=0))
            row.update(diff=diff.estimate, diff_ci=_ci(diff), diff_se=se, mde=mde(se), mde_basis=basis(se))
            if x.shape[0] > 1 or base.shape[0] > 1:
                two = stats.two_level_bootstrap_ci([x, base], [1.0, -1.0], **boot)
                row.update(diff_ci_two_level=_ci(two), diff_se_two_level=two.se, mde_two_level=mde(two.se),
                           mde_two_level_basis=basis(two.se))
            if seeds is not None and _matched([seeds[name], seeds[baseline]]):
                paired = stats.two_level_bootstrap_ci([x, base], [1.0, -1.0], matched_seeds=True, **boot)
                row.update(diff_ci_matched=_ci(paired), diff_se_matched=paired.se, mde_matched=mde(paired.se),
                           mde_matched_basis=basis(paired.se))
        rows[name] = row
    return rows


def _transitions(run: np.ndarray, base: np.ndarray) -> dict[str, int | float]:
    """Questions fixed (baseline fails, run solves), broken (the reverse), net = fixed - broken,
    both solved and both failed, for one run's success vector (n,) against the baseline's (S_b, n):
    counted against each baseline seed, then averaged (integers for a one-seed baseline)."""
    counts = {"fixed": (run & ~base).sum(axis=1), "broken": (~run & base).sum(axis=1),
              "both_solved": (run & base).sum(axis=1), "both_failed": (~run & ~base).sum(axis=1)}
    counts["net"] = counts["fixed"] - counts["broken"]
    number = int if base.shape[0] == 1 else float
    return {key: number(counts[key].mean()) for key in TRANSITIONS}


def _fixed_broken(groups: dict[str, list[EvalRun]], baseline: str) -> dict:
    def solved(run: EvalRun) -> np.ndarray:
        return per_question_values(run.records, "task_success") > 0.5

    base = np.stack([solved(r) for r in groups[baseline]])
    conditions = {}
    for name, members in groups.items():
        if name == baseline:
            continue
        per_seed = {run.seed: _transitions(solved(run), base) for run in members}
        conditions[name] = {"per_seed": per_seed,
                            "mean": {key: float(np.mean([v[key] for v in per_seed.values()])) for key in TRANSITIONS}}
    return {"metric": "task_success", "baseline": baseline, "baseline_seeds": [r.seed for r in groups[baseline]],
            "averaged_over_baseline_seeds": base.shape[0] > 1, "conditions": conditions}


def _contrast_entry(cells: list[np.ndarray], weights, boot: dict, multiplier: float, matched: bool) -> dict:
    """A 2x2 contrast ``sum_c w_c * mean(X_c)``: the paired question bootstrap of its per-question
    values, the resolution ``multiplier * se`` with their SE, and with several seeds the two-level
    (and, when every cell holds the same seeds, the seed-matched) CI and resolution."""
    per_question = sum(w * m.mean(axis=0) for w, m in zip(weights, cells))
    q = stats.bootstrap_mean_ci(per_question, **boot)
    se = stats.mean_standard_error(per_question)
    entry = {"value": q.estimate, "ci": _ci(q), "se": se, "mde": multiplier * se}
    if any(m.shape[0] > 1 for m in cells):
        two = stats.two_level_bootstrap_ci(cells, weights, **boot)
        entry.update(ci_two_level=_ci(two), se_two_level=two.se, mde_two_level=multiplier * two.se)
    if matched:
        paired = stats.two_level_bootstrap_ci(cells, weights, matched_seeds=True, **boot)
        entry.update(ci_matched=_ci(paired), se_matched=paired.se, mde_matched=multiplier * paired.se)
    return entry


def summarize(
    specs: list[str],
    baseline: str = "sft",
    interaction: dict[str, str] | None = None,
    n_resamples: int = stats.DEFAULT_RESAMPLES,
    seed: int = stats.DEFAULT_SEED,
    confidence: float = stats.DEFAULT_CONFIDENCE,
    num_failures: int = 5,
    power: float = stats.DEFAULT_POWER,
    allow_unhashed: bool = False,
    assumed_discordance: float = stats.DEFAULT_ASSUMED_DISCORDANCE,
) -> tuple[dict, list[dict]]:
    """Build the summary dict and the failure rows (nothing is written). ``allow_unhashed``: summarise
    eval folders whose manifest records no output hashes (see :func:`load_eval_folder`)."""
    if not specs:
        raise EvalError("summarize needs at least one eval folder")
    runs = [load_eval_folder(*parse_condition_spec(s), allow_unhashed=allow_unhashed) for s in specs]
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
    tables = _tables(runs, metric_names)
    seeds = {name: [r.seed for r in members] for name, members in groups.items()}
    boot = dict(n_resamples=n_resamples, seed=seed, confidence=confidence)
    multiplier = stats.mde_multiplier(power, confidence)

    table: dict[str, dict[str, dict]] = {}
    for table_name, metric, questions in tables:
        table[table_name] = _comparison_rows({name: _matrix(groups[name], metric, questions) for name in names},
                                             baseline, boot, power, assumed_discordance, seeds)

    inter = None
    if interaction is not None:
        inter = {"cells": dict(interaction),
                 "formula": "(center_fixedL - center_seqmean) - (zscore_fixedL - zscore_seqmean)", "metrics": {}}
        inter["main_effects"] = {name: {"formula": e["formula"], "metrics": {}} for name, e in MAIN_EFFECTS.items()}
        matched = _matched([seeds[interaction[c]] for c in INTERACTION_CELLS])
        for table_name, metric, questions in tables:
            cells = [_matrix(groups[interaction[c]], metric, questions) for c in INTERACTION_CELLS]
            inter["metrics"][table_name] = _contrast_entry(cells, INTERACTION_WEIGHTS, boot, multiplier, matched)
            for name, effect in MAIN_EFFECTS.items():
                inter["main_effects"][name]["metrics"][table_name] = _contrast_entry(
                    cells, effect["weights"], boot, multiplier, matched)

    sampled = [m for m in metric_names if m == "sampled_pass@1" or m.startswith("pass@")]
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
            "matched_scheme": "conditions holding the same several seeds: one rng.integers(0, S, size=(n_resamples, "
                              "S)) seed draw shared by every cell (seed s of each is a matched pair), then shared "
                              "question draws as above",
        },
        "power": {
            "power": power, "alpha": round(1.0 - confidence, 12), "multiplier": multiplier,
            "formula": "mde = (z_{1-alpha/2} + z_{power}) * se, two-sided",
            "se": "diff_se = std_0(x - y) / sqrt(n) over the compared questions (the paired question "
                  "bootstrap's standard error); diff_se_two_level / diff_se_matched = std of the "
                  "(seed-matched) two-level bootstrap replicates",
            "assumed_discordance": assumed_discordance,
            "floor": "on a binary metric mde uses max(se, sqrt(d / n)) with d = assumed_discordance, the share of "
                     "questions two runs disagree on when a policy moves (the full demo's RL runs vs SFT: "
                     "0.067-0.100): a resolution from the observed discordance of runs that barely differ "
                     "would claim more than the design resolves; mde_basis names the one used",
        },
        "sampling": None if not sampled else {
            "metrics": sampled,
            "temperature": next((r.temperature for r in runs if r.temperature is not None), None),
            "num_samples": sorted({int(r["samples"]["n"]) for run in runs for r in run.records if "samples" in r}),
        },
        "subsets": {name: {"metric": metric, "n_gt": int(n_gt(runs[0].records[int(questions[0])])),
                           "n_questions": int(questions.size)}
                    for name, metric, questions in tables if questions is not None},
        "conditions": {
            name: {
                "seeds": {r.seed: {"path": str(r.path),
                                   "checkpoint_sha256": r.manifest.get("checkpoint", {}).get("sha256"),
                                   "metrics": r.metrics, **({"unverified": True} if r.unverified else {})}
                          for r in groups[name]},
            }
            for name in names
        },
        "metrics": table,
        "interaction": inter,
        "fixed_broken": _fixed_broken(groups, baseline),
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
