"""Audited train/val/test splits of agent-math task rows (``minimind-trl data prepare``).

Pipeline: read and validate every input row (errors name file, line and field), normalise it
(:mod:`minimind_trl.data.normalize`), drop later rows whose prompt key repeats an earlier one,
stratify by ``(len(gt), op_type)`` (:mod:`minimind_trl.data.strata`) with per-stratum counts from
:func:`minimind_trl.data.allocation.allocate` (each within one row of its expected share), and write
``train.jsonl``, ``val.jsonl``, ``test.jsonl`` and ``manifest.json`` into a new (or empty)
folder -- built beside it under a hidden name and renamed into place, so it appears complete or
not at all.

Determinism: rows of a stratum are ordered by id, then shuffled with ``random.Random(seed)``; so
the same rows and seed give byte-identical files whatever the input order, and the manifest
(which holds no time stamps or absolute output paths) is identical too.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import datasets

from minimind_trl import __version__
from minimind_trl.data.allocation import allocate, largest_remainder
from minimind_trl.data.manifest import verify_manifest
from minimind_trl.data.normalize import (
    NORMALISATION_RULES,
    canonical_gt_value,
    normalize_conversations,
    prompt_key,
    row_id_for,
)
from minimind_trl.data.strata import OP_TYPES, infer_lang, infer_op_type, stratum_key
from minimind_trl.data.validation import validate_task_row
from minimind_trl.fsio import (
    FAILURE_KINDS,
    DataError,
    DataFormatError,
    build_directory,
    count_blank_lines,
    iter_jsonl,
    iter_jsonl_lines,
    parse_jsonl_line,
    sha256_file,
    write_json_atomic,
    write_jsonl_atomic,
)

SPLITS = ("train", "val", "test")
DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)
MANIFEST_FORMAT = "minimind-trl.splits/1"
_MAX_EXAMPLES = 20
MAX_INVALID_LISTED = 1000  # skipped rows listed in the manifest (all are counted, per kind)


def normalize_task_row(row: dict, path=None, line=None) -> dict:
    """Validate and normalise one task row: ``{"id", "conversations", "gt", "meta", ...}``.

    Missing ``meta`` keys are filled in: ``n_gt = len(gt)``, ``op_type`` and ``lang`` inferred
    from the user text, ``difficulty = "unknown"``; ``meta.op_type_source`` records whether the
    type came from the row (``"meta"``) or the heuristics (``"inferred"``).
    """
    validate_task_row(row, path, line)
    conversations = normalize_conversations(row["conversations"], path, line)
    gt = [canonical_gt_value(value) for value in row["gt"]]
    question = prompt_key(conversations)
    given = {key: value for key, value in (row.get("meta") or {}).items() if value is not None}
    if "n_gt" in given and given["n_gt"] != len(gt):
        raise DataFormatError(path, line, "meta.n_gt", f"is {given['n_gt']!r} but gt has {len(gt)} values")
    if "op_type" in given and given["op_type"] not in OP_TYPES:
        raise DataFormatError(path, line, "meta.op_type",
                              f"must be one of {', '.join(OP_TYPES)}; got {given['op_type']!r}")
    for key in ("lang", "difficulty"):
        if key in given and (not isinstance(given[key], str) or not given[key]):
            raise DataFormatError(path, line, f"meta.{key}", f"must be a non-empty string, got {given[key]!r}")
    meta = {
        "op_type": given.get("op_type") or infer_op_type(question, len(gt)),
        "n_gt": len(gt),
        "lang": given.get("lang") or infer_lang(question),
        "difficulty": given.get("difficulty") or "unknown",
    }
    meta.update({key: value for key, value in given.items() if key not in meta and key != "op_type_source"})
    meta["op_type_source"] = given.get("op_type_source") or ("meta" if "op_type" in given else "inferred")
    out = {"id": row.get("id") or row_id_for(conversations), "conversations": conversations, "gt": gt, "meta": meta}
    out.update({key: value for key, value in row.items() if key not in out})
    return out


def _resolve_sizes(total: int, sizes: list[int] | None, fractions: list[float] | None) -> list[int]:
    """Split sizes plus the unused remainder as a fourth entry."""
    if sizes is not None and fractions is not None:
        raise DataError("give either sizes or fractions, not both")
    if sizes is not None:
        if len(sizes) != 3 or any(size < 0 for size in sizes):
            raise DataError(f"sizes must be three non-negative integers (train,val,test), got {sizes}")
        if sum(sizes) > total:
            raise DataError(f"sizes {sizes} need {sum(sizes)} rows but only {total} remain after validation and "
                            "de-duplication")
        return list(sizes) + [total - sum(sizes)]
    fractions = list(DEFAULT_FRACTIONS if fractions is None else fractions)
    if len(fractions) != 3 or any(f < 0 for f in fractions) or sum(fractions) > 1 + 1e-9 or sum(fractions) <= 0:
        raise DataError(f"fractions must be three non-negative numbers adding up to at most 1, got {fractions}")
    rest = max(0.0, 1.0 - sum(fractions))
    return largest_remainder(total, fractions + [rest if rest > 1e-9 else 0.0])


def _read_inputs(inputs: list[str], skip_invalid: bool) -> tuple[list[dict], list[dict], list[dict]]:
    """Normalised rows (each with its origin), input records and skipped-row records."""
    rows, records, invalid = [], [], []
    for path in inputs:
        if not Path(path).is_file():
            raise DataError(f"{path}: input file does not exist")
        valid = read = 0
        for line, raw in iter_jsonl_lines(path):
            read += 1
            try:
                rows.append((normalize_task_row(parse_jsonl_line(raw, path, line), path, line), (path, line)))
                valid += 1
            except DataFormatError as exc:
                if not skip_invalid:
                    raise
                invalid.append(_invalid_record(exc))
        if not read:
            raise DataError(f"{path}: no rows (the file is empty or blank)")
        records.append({"path": str(path), "sha256": sha256_file(path), "rows_read": read,
                        "rows_valid": valid, "blank_lines": count_blank_lines(path)})
    return rows, records, invalid


def _invalid_record(error: DataFormatError) -> dict:
    return {"file": error.path, "line": error.line, "field": error.field, "kind": error.kind, "reason": error.reason}


def _deduplicate(rows: list[tuple[dict, tuple[str, int]]], skip_invalid: bool,
                 invalid: list[dict]) -> tuple[list[dict], dict]:
    """Keep the first row of every prompt key. A later row reusing an earlier row's id for a
    different question is an error (or, with ``skip_invalid``, dropped and listed as invalid)."""
    kept: dict[str, tuple[dict, tuple[str, int]]] = {}
    by_id: dict[str, tuple[str, int]] = {}
    dropped, conflicting, examples = 0, 0, []
    for row, origin in rows:
        key = prompt_key(row["conversations"])
        if key in kept:
            dropped += 1
            first, first_origin = kept[key]
            conflicting += first["gt"] != row["gt"]
            if len(examples) < _MAX_EXAMPLES:
                examples.append({"kept": "%s:%d" % first_origin, "dropped": "%s:%d" % origin,
                                 "same_gt": first["gt"] == row["gt"]})
            continue
        if row["id"] in by_id:
            error = DataFormatError(*origin, "id", f"{row['id']!r} is already used by a different question at "
                                                   "%s:%d" % by_id[row["id"]], "duplicate_id")
            if not skip_invalid:
                raise error
            invalid.append(_invalid_record(error))
            continue
        by_id[row["id"]] = origin
        kept[key] = (row, origin)
    report = {"dropped": dropped, "conflicting_gt": conflicting, "examples": examples}
    return [row for row, _ in kept.values()], report


def _stratified_parts(rows: list[dict], part_sizes: list[int], seed: int) -> tuple[list[list[dict]], dict]:
    """Rows per part (train, val, test, unused) with per-stratum counts from :func:`allocate`;
    returns the parts (each shuffled) and the per-stratum report."""
    strata: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        strata[stratum_key(row["meta"]["n_gt"], row["meta"]["op_type"])].append(row)
    keys = sorted(strata)
    counts = allocate([len(strata[key]) for key in keys], part_sizes)
    rng = random.Random(seed)
    parts: list[list[dict]] = [[] for _ in part_sizes]
    names = list(SPLITS) + ["unused"]
    report = {}
    for key, row_counts in zip(keys, counts):
        members = sorted(strata[key], key=lambda row: row["id"])
        rng.shuffle(members)
        start = 0
        for part, count in zip(parts, row_counts):
            part.extend(members[start:start + count])
            start += count
        expected = {name: round(float(Fraction(len(members) * size, len(rows))), 4)
                    for name, size in zip(names, part_sizes)}
        report[key] = {"total": len(members), **dict(zip(names, row_counts)), "expected": expected}
    for part in parts:
        rng.shuffle(part)
    return parts, report


def _write_folder(out: Path, parts: list[list[dict]], manifest: dict) -> None:
    """Write the split files and the manifest (its ``outputs`` filled in here) into a hidden
    sibling folder, then move that folder into place (:func:`minimind_trl.fsio.build_directory`;
    ``out`` is absent or empty), so a crash never leaves a half-written split folder."""
    with build_directory(out) as staging:
        for name, part in zip(SPLITS, parts):
            path = write_jsonl_atomic(staging / f"{name}.jsonl", part)
            manifest["outputs"][path.name] = {"sha256": sha256_file(path), "rows": len(part)}
        write_json_atomic(staging / "manifest.json", manifest)


def prepare_splits(
    inputs: list[str | os.PathLike],
    output_dir: str | os.PathLike,
    seed: int = 42,
    sizes: list[int] | None = None,
    fractions: list[float] | None = None,
    skip_invalid: bool = False,
) -> dict:
    """Write stratified, de-duplicated splits and their manifest into ``output_dir`` (absent or
    empty); returns the manifest. It holds no time stamps or output paths, so reruns are
    byte-identical."""
    out = Path(output_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"{out}: output folder is not empty (refusing to overwrite earlier splits)")
    inputs = [str(path) for path in inputs]
    if not inputs:
        raise DataError("no input files given")
    raw_rows, records, invalid = _read_inputs(inputs, skip_invalid)
    rows, duplicates = _deduplicate(raw_rows, skip_invalid, invalid)
    if not rows:
        raise DataError(f"no valid task rows in {', '.join(inputs)}")
    part_sizes = _resolve_sizes(len(rows), sizes, fractions)
    parts, strata_report = _stratified_parts(rows, part_sizes, seed)
    manifest: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "created_by": "minimind-trl data prepare",
        "package_version": __version__,
        "seed": seed,
        "requested": {"sizes": list(sizes)} if sizes is not None
        else {"fractions": list(fractions or DEFAULT_FRACTIONS)},
        "inputs": records,
        "outputs": {},
        "split_sizes": dict(zip(list(SPLITS) + ["unused"], part_sizes)),
        "rows": {"read": sum(r["rows_read"] for r in records), "invalid_skipped": len(invalid),
                 "invalid_by_kind": {kind: sum(r["kind"] == kind for r in invalid) for kind in FAILURE_KINDS},
                 "duplicates_dropped": duplicates["dropped"], "after_dedup": len(rows),
                 "used": sum(part_sizes[:3]), "unused": part_sizes[3]},
        "duplicates": duplicates,
        "invalid_rows": invalid[:MAX_INVALID_LISTED],
        "stratification": {
            "key": "n_gt|op_type",
            "guarantee": "for every stratum h and split s: |count - N_h * n_s / N| < 1",
            "op_type_inferred_rows": sum(row["meta"]["op_type_source"] == "inferred" for row in rows),
        },
        "strata": strata_report,
        "normalisation": NORMALISATION_RULES,
    }
    _write_folder(out, parts[:3], manifest)
    return manifest


def read_split(folder: str | os.PathLike, name: str, manifest: dict | None = None) -> list[dict]:
    """The task rows of ``folder/<name>.jsonl`` (none when the file is absent), each read through
    the bounded reader and checked with :func:`validate_task_row` (errors name file, line and
    field); with ``manifest``, the row count must be the one it records."""
    path = Path(folder) / f"{name}.jsonl"
    rows = [validate_task_row(row, path, line) for line, row in iter_jsonl(path)] if path.is_file() else []
    outputs = (manifest or {}).get("outputs") or {}
    if path.name in outputs and outputs[path.name].get("rows") != len(rows):
        raise DataError(f"{path}: holds {len(rows)} rows, manifest records {outputs[path.name].get('rows')}")
    return rows


def load_splits(folder: str | os.PathLike, verify: bool = True):
    """The split folder as a ``datasets.DatasetDict`` via ``load_dataset("json", data_files=...)``.

    Every row is first read and checked by :func:`read_split`; with ``verify`` (default) every
    file's SHA-256 and row count are checked against the manifest. Empty splits are left out (Arrow
    cannot infer a schema from an empty file).
    """
    folder = Path(folder)
    manifest = verify_manifest(folder) if verify else None
    files = {name: str(folder / f"{name}.jsonl") for name in SPLITS if read_split(folder, name, manifest)}
    if not files:
        raise DataError(f"{folder}: no non-empty split files")
    return datasets.load_dataset("json", data_files=files)
