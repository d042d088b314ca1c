"""`summarize`: paired CIs vs an independent reference, interaction, seeds, provenance, bad input."""

import hashlib
import json
import math
import re
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
    SamplingMismatchError,
    SplitMismatchError,
)
from minimind_trl.eval.report import write_summary
from minimind_trl.eval.summarize import parse_condition_spec, summarize

B = 800  # resamples in tests (the CLI default is 10,000)
N = 40
SPLIT_SHA = "a" * 64


def write_eval_folder(path: Path, success, *, split_sha=SPLIT_SHA, split="test", ids=None, ckpt="c" * 64,
                      n_gt=None, malformed=None, samples=None, temperature=0.8):
    """A minimal eval folder: records with the required keys, a manifest, metrics. Optional per-question
    ``n_gt`` (GT values), ``malformed`` (malformed calls) and ``samples`` ((n, num_correct), drawn at
    ``temperature``, recorded in the manifest as ``eval --pass-k 1`` does)."""
    ids = ids or [f"q{i:03d}" for i in range(len(success))]
    path.mkdir(parents=True)
    rows = []
    for i, (qid, s) in enumerate(zip(ids, success)):
        k = 1 if n_gt is None else int(n_gt[i])
        rows.append({
            "id": qid, "question": f"what is {qid}?", "gt": ["7"] * k, "n_gt": k, "success": bool(s),
            "all_gt_covered": bool(s), "gt_hits": [bool(s)] * k, "n_tool_calls": int(s) + 1,
            "answer_length": 10 + 5 * int(s), "final_answer": "7" if s else "8", "text": f"trajectory for {qid}",
            "op_type": "arith",
        })
        if malformed is not None:
            rows[-1]["malformed_calls"] = int(malformed[i])
        if samples is not None:
            n, c = samples[i]
            rows[-1]["samples"] = {"n": n, "num_correct": c, "temperature": temperature,
                                   "successes": [True] * c + [False] * (n - c)}
            rows[-1]["pass_at_k"] = {"1": c / n}
    # reversed order on disk: summarize must align by id, not by file order
    (path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))
    sampling = None if samples is None else {"k": [1], "num_samples": samples[0][0], "temperature": temperature}
    (path / "eval_manifest.json").write_text(json.dumps({
        "checkpoint": {"sha256": ckpt}, "split": {"name": split, "manifest_sha256": split_sha, "evaluated": len(rows)},
        "pass_at_k": sampling}))
    (path / "metrics.json").write_text(json.dumps({"task_success": float(np.mean(success))}))
    return _with_output_hashes(path)


def _with_output_hashes(folder: Path) -> Path:
    """Record records.jsonl's and metrics.json's SHA-256 in the manifest, as `minimind-trl eval` does."""
    manifest = json.loads((folder / "eval_manifest.json").read_text())
    manifest["outputs"] = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                           for name in ("records.jsonl", "metrics.json")}
    (folder / "eval_manifest.json").write_text(json.dumps(manifest))
    return folder


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


INTERACTION_CELLS = {"zscore_seqmean": "A", "zscore_fixedL": "B", "center_seqmean": "C", "center_fixedL": "D"}


def interaction_folders(tmp_path, seed: int, d_seeds: int):
    """Eval folders of cells A, B, C (one seed each) and D (``d_seeds`` seeds) with random successes:
    (cells, D's per-seed vectors, summarize specs)."""
    rng = np.random.default_rng(seed)
    cells = {name: rng.integers(0, 2, N) for name in ("A", "B", "C")}
    d_values = [rng.integers(0, 2, N) for _ in range(d_seeds)]
    specs = [f"{n}={write_eval_folder(tmp_path / n, v)}" for n, v in cells.items()]
    specs += [f"D@{s}={write_eval_folder(tmp_path / f'D{s}', v)}" for s, v in enumerate(d_values)]
    return cells, d_values, specs


def test_interaction_and_two_level_seeds(tmp_path):
    cells, d_seeds, specs = interaction_folders(tmp_path, 1, 3)
    specs.append(f"sft={write_eval_folder(tmp_path / 'sft', cells['A'])}")
    inter = INTERACTION_CELLS
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


def test_matched_seeds_pair_seed_s_of_each_condition(tmp_path):
    # Seed s sets a shared level (seed 42 solves the first 8 questions, 43 the first 20, 44 the first
    # 32) in both conditions; "up" solves 4 more questions than "base" in every seed. The seed-matched
    # CI sees only that +0.1 (and the questions); the independent one also the seeds' spread.
    levels = {"42": 8, "43": 20, "44": 32}
    base = {s: (np.arange(N) < k).astype(int) for s, k in levels.items()}
    up = {s: (np.arange(N) < k + 4).astype(int) for s, k in levels.items()}
    specs = [f"base@{s}={write_eval_folder(tmp_path / f'b{s}', v)}" for s, v in base.items()]
    specs += [f"up@{s}={write_eval_folder(tmp_path / f'u{s}', v)}" for s, v in up.items()]
    specs += [f"other@{s}={write_eval_folder(tmp_path / f'o{s}', up[s])}" for s in ("42", "43")]
    summary, failures = summarize(specs, baseline="base", n_resamples=B, seed=2, assumed_discordance=0)
    row = summary["metrics"]["task_success"]["up"]
    x = np.array([up[s] for s in levels], float)
    y = np.array([base[s] for s in levels], float)
    ref = stats.two_level_bootstrap_ci([x, y], [1, -1], n_resamples=B, seed=2, matched_seeds=True)
    assert row["diff"] == pytest.approx(0.1)
    assert row["diff_ci_matched"] == pytest.approx([ref.low, ref.high])
    assert row["diff_se_matched"] == pytest.approx(ref.se) and row["mde_matched"] == pytest.approx(
        stats.mde_multiplier() * ref.se)
    # every seed's difference is exactly +0.1 on the same 4 questions: only the question draw varies
    assert row["diff_ci_matched"][0] > 0
    assert row["diff_ci_two_level"][1] - row["diff_ci_two_level"][0] > \
        3 * (row["diff_ci_matched"][1] - row["diff_ci_matched"][0])
    # seeds 42 and 43 only: not the baseline's seeds, so no matched pair
    assert "diff_ci_matched" not in summary["metrics"]["task_success"]["other"]
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    assert "Δ 95% CI (matched seeds) |" in md
    assert f"{row['mde_matched']:.4f} (matched seeds)" in md


def test_interaction_with_matched_seeds(tmp_path):
    rng = np.random.default_rng(6)
    cells = {c: np.stack([rng.integers(0, 2, N) for _ in range(2)]) for c in "ABCD"}
    specs = [f"{c}@{s}={write_eval_folder(tmp_path / f'{c}{s}', cells[c][i])}"
             for c in "ABCD" for i, s in enumerate(("1", "2"))]
    summary, failures = summarize(specs, baseline="A", interaction=INTERACTION_CELLS, n_resamples=B, seed=5)
    e = summary["interaction"]["metrics"]["task_success"]
    ref = stats.two_level_bootstrap_ci([cells[c].astype(float) for c in "ABCD"], [1, -1, -1, 1], n_resamples=B,
                                       seed=5, matched_seeds=True)
    assert e["ci_matched"] == pytest.approx([ref.low, ref.high]) and e["se_matched"] == pytest.approx(ref.se)
    assert e["mde_matched"] == pytest.approx(stats.mde_multiplier() * ref.se)
    # main effects: each factor's level averaged over the other's, A-D = zscore/seqmean, zscore/fixedL,
    # center/seqmean, center/fixedL
    mean = {c: cells[c].mean(axis=0) for c in "ABCD"}
    effects = (("advantage", (mean["C"] + mean["D"] - mean["A"] - mean["B"]) / 2, [-.5, -.5, .5, .5]),
               ("reduction", (mean["B"] + mean["D"] - mean["A"] - mean["C"]) / 2, [-.5, .5, -.5, .5]))
    for name, per_q, weights in effects:
        m = summary["interaction"]["main_effects"][name]["metrics"]["task_success"]
        assert m["value"] == pytest.approx(per_q.mean())
        assert m["ci"] == pytest.approx(_reference_ci(per_q, seed=5))
        assert m["mde"] == pytest.approx(stats.mde_multiplier() * np.std(per_q) / np.sqrt(N))
        ref = stats.two_level_bootstrap_ci([cells[c].astype(float) for c in "ABCD"], weights, n_resamples=B, seed=5,
                                           matched_seeds=True)
        assert m["ci_matched"] == pytest.approx([ref.low, ref.high])
        two = stats.two_level_bootstrap_ci([cells[c].astype(float) for c in "ABCD"], weights, n_resamples=B, seed=5)
        assert m["ci_two_level"] == pytest.approx([two.low, two.high])
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    assert "| metric | interaction | 95% CI (questions) | 95% CI (seeds+questions) | 95% CI (matched seeds) |" in md
    adv = summary["interaction"]["main_effects"]["advantage"]["metrics"]["task_success"]
    assert "## 2x2 main effects" in md and f"| advantage | task_success | {adv['value']:+.4f} |" in md


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


# --- beside greedy success: malformed calls, sampled pass@1, success by n_gt, fixed / broken, resolution


def test_questions_fixed_and_broken_counted_by_hand(tmp_path):
    sft = [1, 1, 1, 0, 0, 0, 0, 1]
    g1 = [1, 0, 1, 1, 1, 0, 0, 1]  # fixed q3 q4, broken q1; both solved q0 q2 q7, both failed q5 q6
    g2 = [0, 1, 1, 1, 1, 1, 0, 1]  # fixed q3 q4 q5, broken q0; both solved q1 q2 q7, both failed q6
    specs = [f"sft={write_eval_folder(tmp_path / 'sft', sft)}",
             f"grpo@1={write_eval_folder(tmp_path / 'g1', g1)}", f"grpo@2={write_eval_folder(tmp_path / 'g2', g2)}"]
    summary, failures = summarize(specs, n_resamples=B)
    fb = summary["fixed_broken"]
    assert fb["metric"] == "task_success" and fb["baseline_seeds"] == ["0"] and "sft" not in fb["conditions"]
    grpo = fb["conditions"]["grpo"]
    assert grpo["per_seed"]["1"] == {"fixed": 2, "broken": 1, "net": 1, "both_solved": 3, "both_failed": 2}
    assert grpo["per_seed"]["2"] == {"fixed": 3, "broken": 1, "net": 2, "both_solved": 3, "both_failed": 1}
    assert grpo["mean"] == {"fixed": 2.5, "broken": 1.0, "net": 1.5, "both_solved": 3.0, "both_failed": 1.5}
    # net / n is the paired difference in task success
    assert grpo["mean"]["net"] / 8 == pytest.approx(summary["metrics"]["task_success"]["grpo"]["diff"])
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    section = md[md.index("## Questions fixed / broken"):]
    assert "| grpo | 1 | 2 | 1 | +1 |" in section and "| grpo | 2 | 3 | 1 | +2 |" in section
    assert "| grpo | mean | 2.50 | 1.00 | +1.50 |" in section

    # a baseline with two seeds: counted against each, then averaged
    sft_b = [1, 1, 1, 1, 1, 0, 0, 0]  # against g1: fixed q7, broken q1
    specs = [f"sft@a={tmp_path / 'sft'}", f"sft@b={write_eval_folder(tmp_path / 'sft_b', sft_b)}",
             f"grpo@1={tmp_path / 'g1'}"]
    fb = summarize(specs, n_resamples=B)[0]["fixed_broken"]
    assert fb["averaged_over_baseline_seeds"] and fb["baseline_seeds"] == ["a", "b"]
    assert fb["conditions"]["grpo"]["per_seed"]["1"] == {
        "fixed": 1.5, "broken": 1.0, "net": 0.5, "both_solved": 3.5, "both_failed": 2.0}


def test_success_by_number_of_gt_values(tmp_path):
    sft, grpo, _ = _vectors()
    n_gt = np.array([1, 2, 3, 2] * (N // 4))
    specs = [str(write_eval_folder(tmp_path / name, v, n_gt=n_gt)) for name, v in (("sft", sft), ("grpo", grpo))]
    summary, failures = summarize(specs, n_resamples=B, seed=2)
    assert summary["subsets"] == {
        f"task_success[n_gt={k}]": {"metric": "task_success", "n_gt": k, "n_questions": int((n_gt == k).sum())}
        for k in (1, 2, 3)}
    # the by-n_gt tables follow the whole-set tables
    names = list(summary["metrics"])
    assert names[-3:] == ["task_success[n_gt=1]", "task_success[n_gt=2]", "task_success[n_gt=3]"]
    assert names.index("task_success") < names.index("mean_answer_length") < names.index("task_success[n_gt=1]")
    for k in (1, 2, 3):
        mask = n_gt == k
        row = summary["metrics"][f"task_success[n_gt={k}]"]["grpo"]
        assert row["mean"] == pytest.approx(grpo[mask].mean())
        assert row["diff"] == pytest.approx(grpo[mask].mean() - sft[mask].mean())
        # the bootstrap resamples the subset's questions only
        assert row["diff_ci"] == pytest.approx(_reference_ci((grpo - sft)[mask], seed=2))
        assert row["ci"] == pytest.approx(_reference_ci(grpo[mask], seed=2))
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    assert f"## task_success[n_gt=2] ({(n_gt == 2).sum()} questions)" in md

    # one number of GT values: no subset tables (they would repeat task_success)
    single = [f"{name}={write_eval_folder(tmp_path / f'one_{name}', v)}" for name, v in (("sft", sft), ("grpo", grpo))]
    one = summarize(single, n_resamples=B)[0]
    assert one["subsets"] == {} and not any("[n_gt=" in m for m in one["metrics"])
    # the same question with another number of GT values is another question set
    other = n_gt.copy()
    other[5] = 1
    moved = str(write_eval_folder(tmp_path / "moved", grpo, n_gt=other))
    with pytest.raises(QuestionSetMismatchError, match="GT values"):
        summarize([specs[0], moved], n_resamples=B)


def test_smallest_resolvable_difference_hand_worked(tmp_path):
    """Paired binary case with b = 2 broken and c = 6 fixed of n = 40: d = x - y is +1 six times and
    -1 twice, so SE = sqrt((b + c)/n - ((c - b)/n)^2) / sqrt(n) = sqrt(0.2 - 0.01) / sqrt(40) and
    MDE = (z_0.975 + z_0.8) * SE = 2.8015852 * 0.0689202 = 0.1930859."""
    sft = np.array([0] * 6 + [1] * 2 + [1] * 12 + [0] * 20)
    grpo = np.array([1] * 6 + [0] * 2 + [1] * 12 + [0] * 20)
    specs = [str(write_eval_folder(tmp_path / name, v)) for name, v in (("sft", sft), ("grpo", grpo))]
    summary, failures = summarize(specs, n_resamples=4000)
    row = summary["metrics"]["task_success"]["grpo"]
    assert summary["fixed_broken"]["conditions"]["grpo"]["per_seed"]["0"]["fixed"] == 6
    assert row["diff_se"] == pytest.approx(0.0689202437604511, rel=1e-12)
    assert row["mde"] == pytest.approx(0.19308593614802233, rel=1e-9) and row["mde_basis"] == "observed"
    # independent: numpy's standard deviation and scipy's normal quantiles
    scipy_stats = pytest.importorskip("scipy.stats")
    z = scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)
    assert row["mde"] == pytest.approx(z * np.std(grpo - sft) / np.sqrt(N), rel=1e-12)
    assert summary["power"]["multiplier"] == pytest.approx(z, rel=1e-12)
    assert summary["power"]["alpha"] == pytest.approx(0.05) and summary["power"]["power"] == 0.8
    # the bootstrap's own standard error estimates the same SE
    boot = stats.paired_difference_ci(grpo, sft, n_resamples=4000)
    assert boot.se == pytest.approx(row["diff_se"], rel=0.06)
    base_row = summary["metrics"]["task_success"]["sft"]
    assert base_row["mde"] is None and base_row["diff_se"] is None
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    assert "Smallest resolvable Δ (80% power, two-sided α = 0.05): grpo 0.1931 (questions)." in md


def test_two_level_resolution_and_interaction_resolution(tmp_path):
    cells, d_seeds, specs = interaction_folders(tmp_path, 4, 2)
    inter = INTERACTION_CELLS
    summary, failures = summarize(specs, baseline="A", interaction=inter, n_resamples=B, seed=1)
    k = stats.mde_multiplier()
    row = summary["metrics"]["task_success"]["D"]
    two = stats.two_level_bootstrap_ci([np.array(d_seeds, float), cells["A"][None].astype(float)], [1, -1],
                                       n_resamples=B, seed=1)
    assert row["diff_se_two_level"] == pytest.approx(two.se) and row["mde_two_level"] == pytest.approx(k * two.se)
    assert row["mde"] == pytest.approx(k * np.std(np.mean(d_seeds, axis=0) - cells["A"]) / np.sqrt(N))
    e = summary["interaction"]["metrics"]["task_success"]
    per_q = (np.mean(d_seeds, axis=0) - cells["C"]) - (cells["B"] - cells["A"])
    assert e["mde"] == pytest.approx(k * np.std(per_q) / np.sqrt(N)) and e["mde_two_level"] > 0
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    line = next(x for x in md.splitlines()[md.splitlines().index("## task_success"):] if x.startswith("Smallest"))
    assert f"D {row['mde']:.4f} (questions), {row['mde_two_level']:.4f} (seeds+questions)" in line
    assert "Smallest resolvable interaction" in md


def test_malformed_calls_per_trajectory(tmp_path):
    sft, grpo, _ = _vectors()
    m_sft = np.arange(N) % 3  # 0, 1, 2, ...
    m_grpo = (np.arange(N) % 3 == 0).astype(int)
    specs = [str(write_eval_folder(tmp_path / "sft", sft, malformed=m_sft)),
             str(write_eval_folder(tmp_path / "grpo", grpo, malformed=m_grpo))]
    table = summarize(specs, n_resamples=B)[0]["metrics"]["mean_malformed_calls"]
    assert table["sft"]["mean"] == pytest.approx(m_sft.mean())
    assert table["grpo"]["diff"] == pytest.approx(m_grpo.mean() - m_sft.mean())
    assert table["grpo"]["diff_ci"] == pytest.approx(_reference_ci(m_grpo - m_sft))
    # a run whose records lack malformed_calls: no table
    specs[1] = str(write_eval_folder(tmp_path / "old", grpo))
    assert "mean_malformed_calls" not in summarize(specs, n_resamples=B)[0]["metrics"]
    bad = write_eval_folder(tmp_path / "bad", grpo, malformed=[-1] * N)
    with pytest.raises(EvalFolderError, match="malformed_calls"):
        summarize([specs[0], str(bad)], n_resamples=B)


def test_sampled_pass_at_1_only_when_every_run_was_sampled(tmp_path):
    sft, grpo, _ = _vectors()
    rng = np.random.default_rng(9)
    c_sft, c_grpo = rng.integers(0, 5, N), rng.integers(0, 5, N)
    specs = [str(write_eval_folder(tmp_path / "sft", sft, samples=[(4, int(c)) for c in c_sft])),
             str(write_eval_folder(tmp_path / "grpo", grpo, samples=[(4, int(c)) for c in c_grpo]))]
    summary, failures = summarize(specs, n_resamples=B)
    table = summary["metrics"]["sampled_pass@1"]
    assert "pass@1" not in summary["metrics"]  # the same number per question: one table
    assert table["sft"]["mean"] == pytest.approx(c_sft.mean() / 4)
    assert table["grpo"]["diff_ci"] == pytest.approx(_reference_ci((c_grpo - c_sft) / 4))
    assert summary["sampling"] == {"metrics": ["sampled_pass@1"], "temperature": 0.8, "num_samples": [4]}
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    section = md[md.index("## sampled_pass@1"):]
    assert "Sampled at temperature 0.8, 4 samples per question." in section.split("## ")[1]

    # a greedy-only run among them: the sampled table is skipped, not an error
    greedy = str(write_eval_folder(tmp_path / "greedy", grpo))
    summary = summarize([specs[0], greedy], n_resamples=B)[0]
    assert "sampled_pass@1" not in summary["metrics"] and summary["sampling"] is None
    md = (write_summary(tmp_path / "out2", summary, []) / "summary.md").read_text()
    assert "sampled_pass@1" not in md and "Sampled at" not in md

    # sampled at another temperature: refused
    hot = str(write_eval_folder(tmp_path / "hot", grpo, samples=[(4, 1)] * N, temperature=1.0))
    with pytest.raises(SamplingMismatchError, match=r"temperature.*0\.8.*1"):
        summarize([specs[0], hot], n_resamples=B)
    bad = write_eval_folder(tmp_path / "bad", grpo, samples=[(4, 5)] * N)
    with pytest.raises(EvalFolderError, match="samples"):
        summarize([specs[0], str(bad)], n_resamples=B)


def test_runs_that_barely_differ_resolve_what_a_moving_policy_would(tmp_path):
    """Issue 38.6: the resolution of two identical runs (or runs one question apart) is not derived
    from their near-zero discordance but from the assumed discordance d of a moving policy:
    MDE = (z_0.975 + z_0.8) * sqrt(d / n), marked in summary.md; with d = 0 the observed figure."""
    sft, _, _ = _vectors()
    one_apart = sft.copy()
    one_apart[0] = 1 - one_apart[0]
    k = stats.mde_multiplier()
    for other, observed in ((sft, 0.0), (one_apart, np.std(one_apart - sft) / np.sqrt(N))):
        specs = [f"sft={write_eval_folder(tmp_path / f'sft{observed}', sft)}",
                 f"gspo={write_eval_folder(tmp_path / f'gspo{observed}', other)}"]
        summary, failures = summarize(specs, n_resamples=B)
        row = summary["metrics"]["task_success"]["gspo"]
        assert row["diff_se"] == pytest.approx(observed)
        assert row["mde"] == pytest.approx(k * math.sqrt(0.08 / N), rel=1e-12) and row["mde"] > k * observed
        assert row["mde_basis"] == "assumed discordance 0.08" and summary["power"]["assumed_discordance"] == 0.08
        md = (write_summary(tmp_path / f"out{observed}", summary, failures) / "summary.md").read_text()
        assert f"gspo {row['mde']:.4f}* (questions)." in md and "the per-question differences barely vary" in md
    summary, failures = summarize(specs[:1] + [f"gspo={write_eval_folder(tmp_path / 'same', sft)}"], n_resamples=B,
                                  assumed_discordance=0.0)
    assert summary["metrics"]["task_success"]["gspo"]["mde"] == 0.0
    assert summary["fixed_broken"]["conditions"]["gspo"]["per_seed"]["0"]["net"] == 0
    md = (write_summary(tmp_path / "out", summary, failures) / "summary.md").read_text()
    assert "gspo n/a (constant difference) (questions)." in md


def test_records_edited_after_evaluation_are_refused(tmp_path, capsys):
    sft, grpo, _ = _vectors()
    base = write_eval_folder(tmp_path / "sft", sft)
    run = write_eval_folder(tmp_path / "grpo", grpo)
    assert summarize_main([str(base), str(run), "--output-dir", str(tmp_path / "ok")]) == 0
    lines = (run / "records.jsonl").read_text().splitlines()
    edited = json.loads(lines[0])
    flip = not edited["success"]
    edited.update(success=flip, all_gt_covered=flip, gt_hits=[flip] * len(edited["gt_hits"]))
    (run / "records.jsonl").write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n")
    capsys.readouterr()
    assert summarize_main([str(base), str(run), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "eval_manifest.json" in err and "outputs.records.jsonl" in err and "edited" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("change, field", [
    ({"success": True, "all_gt_covered": True, "gt_hits": [False]}, "all_gt_covered"),
    ({"success": True, "all_gt_covered": False, "gt_hits": [False]}, "success"),
    ({"gt": ["7"], "n_gt": 2, "gt_hits": [True], "success": True, "all_gt_covered": True}, "n_gt"),
    ({"gt": ["7"], "gt_hits": [True, True], "success": True, "all_gt_covered": True}, "gt_hits"),
    ({"gt_hits": [True], "success": True, "all_gt_covered": True, "gt_coverage": 0.0}, "gt_coverage"),
])
def test_records_that_contradict_themselves_are_refused_naming_file_line_and_field(tmp_path, change, field):
    folder = write_eval_folder(tmp_path / "sft", [1, 0, 1])
    lines = (folder / "records.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row.update(change)
    if "n_gt" not in change:
        row.pop("n_gt", None)
    lines[1] = json.dumps(row)
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    _with_output_hashes(folder)  # as if the evaluation had written them
    with pytest.raises(EvalFolderError, match=rf"records\.jsonl:2: field '{field}'"):
        summarize([str(folder)], n_resamples=B)


# --- issue 40.5: the integrity checks cannot be bypassed, and no non-finite value is summarised


def _edit_manifest(folder: Path, edit) -> Path:
    manifest = json.loads((folder / "eval_manifest.json").read_text())
    edit(manifest)
    (folder / "eval_manifest.json").write_text(json.dumps(manifest))
    return folder


BYPASSES = {
    "outputs_deleted": lambda f: _edit_manifest(f, lambda m: m.pop("outputs")),
    "outputs_empty": lambda f: _edit_manifest(f, lambda m: m.update(outputs={})),
    "outputs_null": lambda f: _edit_manifest(f, lambda m: m.update(outputs=None)),
    "records_unlisted": lambda f: _edit_manifest(f, lambda m: m["outputs"].pop("records.jsonl")),
    "listed_file_missing": lambda f: (f / "metrics.json").unlink(),
    "foreign_entry": lambda f: _edit_manifest(f, lambda m: m["outputs"].update({"../x/records.jsonl": "0" * 64})),
    "evaluated_deleted": lambda f: _edit_manifest(f, lambda m: m["split"].pop("evaluated")),
}
REFUSED_EVEN_WHEN_ALLOWED = ("listed_file_missing", "foreign_entry")


@pytest.mark.parametrize("case", sorted(BYPASSES))
def test_the_hash_check_cannot_be_bypassed(tmp_path, capsys, case):
    sft, grpo, _ = _vectors()
    base = write_eval_folder(tmp_path / "sft", sft)
    run = write_eval_folder(tmp_path / "grpo", grpo)
    BYPASSES[case](run)
    argv = [str(base), str(run), "--output-dir", str(tmp_path / "o"), "--n-resamples", "100"]
    assert summarize_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(run / "eval_manifest.json") in err, err
    assert not (tmp_path / "o").exists()
    code = summarize_main([*argv, "--allow-unhashed"])
    err = capsys.readouterr().err
    if case in REFUSED_EVEN_WHEN_ALLOWED:
        assert code == 2 and "WARNING" not in err
        return
    assert code == 0 and "WARNING" in err and str(run) in err  # loud: on stderr and in the summary
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["conditions"]["grpo"]["seeds"]["0"]["unverified"] and "unverified" not in \
        summary["conditions"]["sft"]["seeds"]["0"]
    assert "WARNING" in (tmp_path / "o" / "summary.md").read_text()


def test_fewer_records_than_the_manifest_evaluated_are_refused(tmp_path):
    sft, _, _ = _vectors()
    folder = _edit_manifest(write_eval_folder(tmp_path / "sft", sft), lambda m: m["split"].update(evaluated=N + 1))
    with pytest.raises(EvalFolderError, match=rf"split\.evaluated.*{N + 1}.*{N} records"):
        summarize([str(folder)], n_resamples=B)


@pytest.mark.parametrize("change, field", [
    ({"gt_coverage": float("nan")}, "gt_coverage"),
    ({"gt_coverage": float("inf")}, "gt_coverage"),
    ({"samples": {"n": 4, "num_correct": 1, "temperature": float("nan")}}, "samples.temperature"),
    ({"samples": {"n": 4, "num_correct": 1, "temperature": float("inf")}}, "samples.temperature"),
    ({"samples": {"n": 4, "num_correct": 1, "temperature": -0.5}}, "samples.temperature"),
    ({"pass_at_k": {"0": 0.5}}, "pass_at_k"),
    ({"pass_at_k": {"01": 0.5}}, "pass_at_k"),
    ({"pass_at_k": {"\u00b2": 0.5}}, "pass_at_k"),
    ({"samples": {"n": 4, "num_correct": 1, "temperature": 0.8}, "pass_at_k": {"5": 0.5}}, "pass_at_k"),
    ({"pass_at_k": {"1": float("nan")}}, "pass_at_k"),
])
def test_non_finite_and_odd_record_values_are_refused(tmp_path, change, field):
    folder = write_eval_folder(tmp_path / "sft", [1, 0, 1])
    lines = (folder / "records.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row.update(change)
    lines[1] = json.dumps(row)  # json writes NaN / Infinity, and Python's reader takes them back
    (folder / "records.jsonl").write_text("\n".join(lines) + "\n")
    _with_output_hashes(folder)
    with pytest.raises(EvalFolderError, match=rf"records\.jsonl:2: field '{re.escape(field)}'"):
        summarize([str(folder)], n_resamples=B)


def test_non_finite_manifest_temperatures_and_metrics_are_refused(tmp_path):
    folder = write_eval_folder(tmp_path / "sft", [1, 0, 1])
    _edit_manifest(folder, lambda m: m.update(pass_at_k={"k": [1], "temperature": float("nan")}))
    with pytest.raises(EvalFolderError, match=r"eval_manifest\.json: field 'pass_at_k\.temperature'"):
        summarize([str(folder)], n_resamples=B)
    folder = write_eval_folder(tmp_path / "grpo", [1, 0, 1])
    (folder / "metrics.json").write_text(json.dumps({"task_success": float("inf"), "by_n_gt": {"1": float("nan")}}))
    _with_output_hashes(folder)
    with pytest.raises(EvalFolderError, match=r"metrics\.json: field 'task_success'"):
        summarize([str(folder)], n_resamples=B)
