"""`summarize`: paired CIs vs an independent reference, interaction, seeds, provenance, bad input."""

import json
from pathlib import Path

import numpy as np
import pytest

from minimind_trl.eval import stats
from minimind_trl.eval.cli import plot_main, summarize_main
from minimind_trl.eval.errors import (
    EvalError,
    EvalFolderError,
    OutputDirNotEmptyError,
    QuestionSetMismatchError,
    SplitMismatchError,
)
from minimind_trl.eval.report import write_summary
from minimind_trl.eval.summarize import parse_condition_spec, summarize

B = 800  # resamples in tests (the CLI default is 10,000)
N = 40
SPLIT_SHA = "a" * 64


def write_eval_folder(path: Path, success, *, split_sha=SPLIT_SHA, split="test", ids=None, ckpt="c" * 64):
    """A minimal eval folder: records with the required keys, a manifest, metrics."""
    ids = ids or [f"q{i:03d}" for i in range(len(success))]
    path.mkdir(parents=True)
    rows = []
    for qid, s in zip(ids, success):
        rows.append({
            "id": qid, "question": f"what is {qid}?", "gt": ["7"], "success": bool(s), "all_gt_covered": bool(s),
            "gt_hits": [bool(s)], "n_tool_calls": int(s) + 1, "answer_length": 10 + 5 * int(s),
            "final_answer": "7" if s else "8", "text": f"trajectory for {qid}", "op_type": "arith",
        })
    # reversed order on disk: summarize must align by id, not by file order
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    (path / "eval_manifest.json").write_text(json.dumps({
        "checkpoint": {"sha256": ckpt}, "split": {"name": split, "manifest_sha256": split_sha}}))
    (path / "metrics.json").write_text(json.dumps({"task_success": float(np.mean(success))}))
    return path


def _vectors(seed=0):
    rng = np.random.default_rng(seed)
    sft = rng.integers(0, 2, N)
    grpo = np.maximum(sft, rng.random(N) < 0.35).astype(int)
    cispo = np.where(rng.random(N) < 0.2, 1 - sft, sft)
    return sft, grpo, cispo


def _reference_ci(v, seed=0, n_resamples=B):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(v), size=(n_resamples, len(v)))
    return list(np.percentile(np.asarray(v, float)[idx].mean(axis=1), [2.5, 97.5]))


def test_parse_condition_spec():
    assert parse_condition_spec("runs/eval/grpo") == ("grpo", "0", Path("runs/eval/grpo"))
    assert parse_condition_spec("runs/eval/grpo@2/") == ("grpo", "2", Path("runs/eval/grpo@2/"))
    assert parse_condition_spec("A=x/y") == ("A", "0", Path("x/y"))
    assert parse_condition_spec("A@s1=x") == ("A", "s1", Path("x"))
    with pytest.raises(EvalError):
        parse_condition_spec("=x")


def test_summary_diffs_and_cis_match_reference(tmp_path):
    sft, grpo, cispo = _vectors()
    specs = [str(write_eval_folder(tmp_path / name, v)) for name, v in (("sft", sft), ("grpo", grpo), ("cispo", cispo))]
    summary, failures = summarize(specs, n_resamples=B, seed=0)
    ts = summary["metrics"]["task_success"]
    assert summary["baseline"] == "sft" and summary["n_questions"] == N
    assert summary["split"] == {"name": "test", "manifest_sha256": SPLIT_SHA}
    assert ts["sft"]["diff"] == 0.0 and ts["sft"]["diff_ci"] is None
    for name, v in (("grpo", grpo), ("cispo", cispo)):
        row = ts[name]
        assert row["mean"] == pytest.approx(v.mean())
        assert row["diff"] == pytest.approx(v.mean() - sft.mean())
        assert row["diff_ci"] == pytest.approx(_reference_ci(v - sft))
        assert row["ci"] == pytest.approx(_reference_ci(v))
        assert "diff_ci_two_level" not in row
    # answer length is 10 + 5 * success in the fake records
    assert summary["metrics"]["mean_answer_length"]["grpo"]["diff"] == pytest.approx(5 * (grpo.mean() - sft.mean()))
    assert summary["conditions"]["grpo"]["seeds"]["0"]["checkpoint_sha256"] == "c" * 64
    assert summary["bootstrap"]["n_resamples"] == B and summary["bootstrap"]["method"] == "percentile"
    # failures: at most 5 per condition, all unsuccessful
    assert failures and all(f["final_answer"] == "8" for f in failures)
    assert max(sum(f["condition"] == c for f in failures) for c in ("sft", "grpo", "cispo")) <= 5


def test_interaction_and_two_level_seeds(tmp_path):
    rng = np.random.default_rng(1)
    cells = {name: rng.integers(0, 2, N) for name in ("A", "B", "C")}
    d_seeds = [rng.integers(0, 2, N) for _ in range(3)]
    specs = [f"{n}={write_eval_folder(tmp_path / n, v)}" for n, v in cells.items()]
    specs += [f"D@{s}={write_eval_folder(tmp_path / f'D{s}', v)}" for s, v in enumerate(d_seeds)]
    specs.append(f"sft={write_eval_folder(tmp_path / 'sft', cells['A'])}")
    inter = {"zscore_seqmean": "A", "zscore_fixedL": "B", "center_seqmean": "C", "center_fixedL": "D"}
    summary, _ = summarize(specs, interaction=inter, n_resamples=B, seed=3)

    d_mean = np.mean(d_seeds, axis=0)
    per_q = (d_mean - cells["C"]) - (cells["B"] - cells["A"])
    got = summary["interaction"]["metrics"]["task_success"]
    assert got["value"] == pytest.approx(per_q.mean())
    assert got["ci"] == pytest.approx(_reference_ci(per_q, seed=3))
    two = stats.two_level_bootstrap_ci(
        [cells["A"][None].astype(float), cells["B"][None].astype(float), cells["C"][None].astype(float),
         np.array(d_seeds, float)], [1, -1, -1, 1], n_resamples=B, seed=3)
    assert got["ci_two_level"] == pytest.approx([two.low, two.high])

    row = summary["metrics"]["task_success"]["D"]
    assert row["n_seeds"] == 3 and row["per_seed"] == pytest.approx([v.mean() for v in d_seeds])
    assert row["diff_ci"] == pytest.approx(_reference_ci(d_mean - cells["A"], seed=3))
    ref = stats.two_level_bootstrap_ci([np.array(d_seeds, float), cells["A"][None].astype(float)], [1, -1],
                                       n_resamples=B, seed=3)
    assert row["diff_ci_two_level"] == pytest.approx([ref.low, ref.high])
    assert "diff_ci_two_level" not in summary["metrics"]["task_success"]["B"]


def test_write_summary_outputs_and_refuses_non_empty(tmp_path):
    sft, grpo, _ = _vectors()
    specs = [str(write_eval_folder(tmp_path / "in" / n, v, ckpt=n[0] * 64)) for n, v in (("sft", sft), ("grpo", grpo))]
    summary, failures = summarize(specs, n_resamples=B)
    out = write_summary(tmp_path / "out", summary, failures)
    assert json.loads((out / "summary.json").read_text())["metrics"]["task_success"]["grpo"]["diff"] == pytest.approx(
        grpo.mean() - sft.mean())
    md = (out / "summary.md").read_text()
    assert "s" * 64 in md and "g" * 64 in md and SPLIT_SHA in md and "## task_success" in md
    assert (out / "failures.jsonl").read_text().count("\n") == len(failures)
    assert "Failure cases" in (out / "failures.md").read_text()
    with pytest.raises(OutputDirNotEmptyError):
        write_summary(out, summary, failures)
    write_summary(out, summary, failures, overwrite=True)


def test_mismatched_inputs_raise(tmp_path):
    sft, grpo, _ = _vectors()
    base = str(write_eval_folder(tmp_path / "sft", sft))
    other_split = str(write_eval_folder(tmp_path / "x", grpo, split_sha="b" * 64))
    with pytest.raises(SplitMismatchError, match="manifest"):
        summarize([base, other_split], n_resamples=B)
    val_split = str(write_eval_folder(tmp_path / "v", grpo, split="val"))
    with pytest.raises(SplitMismatchError):
        summarize([base, val_split], n_resamples=B)
    fewer = str(write_eval_folder(tmp_path / "few", grpo[:-1]))
    with pytest.raises(QuestionSetMismatchError, match="different questions"):
        summarize([base, fewer], n_resamples=B)
    renamed = str(write_eval_folder(tmp_path / "ren", grpo, ids=[f"z{i}" for i in range(N)]))
    with pytest.raises(QuestionSetMismatchError):
        summarize([base, renamed], n_resamples=B)
    with pytest.raises(EvalFolderError, match="not found"):
        summarize([base, str(tmp_path / "missing")], n_resamples=B)
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalFolderError, match="records.jsonl"):
        summarize([base, str(tmp_path / "empty")], n_resamples=B)
    good = str(write_eval_folder(tmp_path / "grpo", grpo))
    with pytest.raises(EvalError, match="baseline"):
        summarize([good], baseline="sft", n_resamples=B)
    with pytest.raises(EvalError, match="interaction"):
        summarize([base, good], interaction={"zscore_seqmean": "sft"}, n_resamples=B)
    with pytest.raises(EvalError, match="more than once"):
        summarize([f"sft@1={base}", f"sft@1={good}"], n_resamples=B)


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
    sft, grpo, _ = _vectors()
    base = str(write_eval_folder(tmp_path / "sft", sft))
    other = str(write_eval_folder(tmp_path / "grpo", grpo, split_sha="d" * 64))
    assert summarize_main([base, other, "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("minimind-trl summarize: error:") and "\n" not in err
    assert not (tmp_path / "o").exists()


def test_cli_summarize_then_plot_bars(tmp_path, capsys):
    sft, grpo, cispo = _vectors()
    specs = [f"{n}={write_eval_folder(tmp_path / n, v)}" for n, v in (("sft", sft), ("grpo", grpo), ("cispo", cispo))]
    assert summarize_main(specs + ["--output-dir", str(tmp_path / "sum"), "--n-resamples", "300"]) == 0
    assert plot_main(["--summary", str(tmp_path / "sum" / "summary.json"), "--output-dir", str(tmp_path / "fig")]) == 0
    png = tmp_path / "fig" / "eval_task_success.png"
    diff_png = tmp_path / "fig" / "eval_task_success_diff.png"
    for p in (png, diff_png):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000


def test_summary_md_shows_each_training_seed(tmp_path):
    sft, grpo, cispo = _vectors()
    specs = [str(write_eval_folder(tmp_path / "sft", sft)),
             f"grpo@42={write_eval_folder(tmp_path / 'g42', grpo)}",
             f"grpo@43={write_eval_folder(tmp_path / 'g43', cispo)}"]
    summary, failures = summarize(specs, baseline="sft", n_resamples=B)
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| grpo | 2 |"))
    assert f"42: {grpo.mean():.3f}, 43: {cispo.mean():.3f}" in row
    assert row.count("[") == 3  # mean CI, question CI and the two-level CI of the difference
    assert next(line for line in md.splitlines() if line.startswith("| sft | 1 |")).count("—") >= 2
