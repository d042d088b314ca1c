"""Writing a summary: summary.json, summary.md (tables), failures.jsonl and failures.md."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from minimind_trl.eval.errors import EvalError, OutputDirNotEmptyError
from minimind_trl.fsio import write_json_atomic, write_jsonl_atomic, write_text_atomic
from minimind_trl.targets import OutputTargetError, TargetNotEmptyError, writing


def _fmt(v: float | None) -> str:
    return "—" if v is None else f"{v:.4f}"


def _fmt_ci(ci: list[float] | None, signed: bool = True) -> str:
    if not ci:
        return "—"
    return f"[{ci[0]:+.4f}, {ci[1]:+.4f}]" if signed else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def _per_seed(summary: dict, name: str, row: dict) -> str:
    """``seed: mean`` for each training seed of a condition (in the order the summary holds them)."""
    seeds = list(summary["conditions"].get(name, {}).get("seeds", {}))
    values = row.get("per_seed") or []
    if len(seeds) != len(values) or len(values) < 2:
        return "—"
    return ", ".join(f"{seed}: {value:.3f}" for seed, value in zip(seeds, values))


def _count(v: int | float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.2f}"


def _net(v: int | float) -> str:
    return f"{v:+d}" if isinstance(v, int) else f"{v:+.2f}"


def _resolution_line(summary: dict, rows: dict) -> list[str]:
    """The smallest resolvable Δ of each comparison in one table (one line under it)."""
    def value(mde: float) -> str:  # 0: the per-question difference never varies, nothing to scale
        return f"{mde:.4f}" if mde > 0 else "n/a (constant difference)"

    parts = []
    for name, row in rows.items():
        if row.get("mde") is None:
            continue
        part = f"{name} {value(row['mde'])}{_floored(row.get('mde_basis'))} (questions)"
        if row.get("mde_two_level") is not None:
            part += f", {value(row['mde_two_level'])}{_floored(row.get('mde_two_level_basis'))} (seeds+questions)"
        if row.get("mde_matched") is not None:
            part += f", {value(row['mde_matched'])}{_floored(row.get('mde_matched_basis'))} (matched seeds)"
        parts.append(part)
    if not parts:
        return []
    p = summary["power"]
    lines = ["", f"Smallest resolvable Δ ({p['power']:.0%} power, two-sided α = {p['alpha']:.2g}): "
             + "; ".join(parts) + "."]
    if any(str(row.get(k, "")).startswith("assumed") for row in rows.values()
           for k in ("mde_basis", "mde_two_level_basis", "mde_matched_basis")):
        lines.append(f"(* the per-question differences barely vary (runs that barely differ, or that differ the "
                     f"same way on nearly every question): the figure assumes the discordance of a moving policy, "
                     f"{p.get('assumed_discordance', 0):g} of the questions, not the observed one.)")
    return lines


def _floored(basis: str | None) -> str:
    return "*" if basis and basis.startswith("assumed") else ""


def _table_heading(summary: dict, name: str) -> str:
    subset = (summary.get("subsets") or {}).get(name)
    return f"## {name}" if subset is None else f"## {name} ({subset['n_questions']} questions)"


def _sampling_line(summary: dict, name: str) -> list[str]:
    sampling = summary.get("sampling")
    if not sampling or name not in sampling["metrics"]:
        return []
    temperature = sampling["temperature"]
    at = "an unrecorded temperature" if temperature is None else f"temperature {temperature:g}"
    n = ", ".join(str(k) for k in sampling["num_samples"]) or "?"
    return ["", f"Sampled at {at}, {n} samples per question."]


def _fixed_broken_section(summary: dict) -> list[str]:
    fb = summary.get("fixed_broken")
    if not fb or not fb["conditions"]:
        return []
    against = (f"each of the baseline's {len(fb['baseline_seeds'])} seeds, then averaged"
               if fb["averaged_over_baseline_seeds"] else "the baseline")
    lines = ["", "## Questions fixed / broken", "",
             f"{fb['metric']} per question against {against} (`{fb['baseline']}`): fixed = the baseline fails "
             "and the run solves, broken = the reverse, net = fixed − broken.", "",
             "| condition | seed | fixed | broken | net |", "|---|---|---|---|---|"]
    for name, cond in fb["conditions"].items():
        for seed, c in cond["per_seed"].items():
            lines.append(f"| {name} | {seed} | {_count(c['fixed'])} | {_count(c['broken'])} | {_net(c['net'])} |")
        if len(cond["per_seed"]) > 1:
            m = cond["mean"]
            lines.append(f"| {name} | mean | {m['fixed']:.2f} | {m['broken']:.2f} | {m['net']:+.2f} |")
    return lines


def _unverified_lines(summary: dict) -> list[str]:
    """A warning naming the eval folders summarised with ``--allow-unhashed`` (no hashes to check)."""
    folders = [f"`{info['path']}`" for cond in summary["conditions"].values() for info in cond["seeds"].values()
               if info.get("unverified")]
    if not folders:
        return []
    return ["", f"**WARNING: unverified evaluations** (summarised with --allow-unhashed: their manifests record no "
                f"SHA-256 or record count, so edits after evaluation cannot be detected): {', '.join(folders)}."]


def _main_effects_section(inter: dict, matched: bool) -> list[str]:
    """The 2x2's main effects: one row per factor and metric, with CIs and the smallest resolvable effect."""
    effects = inter.get("main_effects")
    if not effects:
        return []
    lines = ["", "## 2x2 main effects", ""]
    lines += [f"- {name} = {e['formula']}" for name, e in effects.items()]
    lines += ["", "| effect | metric | value | 95% CI (questions) | 95% CI (seeds+questions) |"
              + (" 95% CI (matched seeds) |" if matched else "") + " resolves (questions / seeds+questions"
              + (" / matched" if matched else "") + ") |",
              "|---|---|---|---|---|" + ("---|" if matched else "") + "---|"]
    kinds = ("mde", "mde_two_level", "mde_matched") if matched else ("mde", "mde_two_level")
    for name, e in effects.items():
        for metric, m in e["metrics"].items():
            cis = [_fmt_ci(m.get(k)) for k in ("ci", "ci_two_level", "ci_matched")[:len(kinds)]]
            resolves = " / ".join(_fmt(m.get(k)) for k in kinds)
            lines.append(f"| {name} | {metric} | {m['value']:+.4f} | {' | '.join(cis)} | {resolves} |")
    return lines


def render_markdown(summary: dict) -> str:
    """summary.md: provenance, one table per metric (each with the smallest Δ it resolves), the
    interaction, questions fixed / broken."""
    b = summary["bootstrap"]
    lines = [
        "# Evaluation summary", "",
        f"Split `{summary['split']['name']}`, manifest SHA256 `{summary['split']['manifest_sha256']}`, "
        f"{summary['n_questions']} questions. Baseline: `{summary['baseline']}`.", "",
        f"CIs: {b['confidence']:.0%} {b['method']} bootstrap over questions, {b['n_resamples']:,} resamples, "
        f"seed {b['seed']}, paired on question id. Two-level CIs resample training seeds per "
        "condition, then questions; matched-seed CIs (conditions holding the same seeds) resample seed s of "
        "both together.", "",
        "## Checkpoints", "", "| condition | seed | checkpoint SHA256 | eval folder |", "|---|---|---|---|",
    ]
    for name, cond in summary["conditions"].items():
        for seed, info in cond["seeds"].items():
            lines.append(f"| {name} | {seed} | `{info['checkpoint_sha256']}` | `{info['path']}` |")
    lines += _unverified_lines(summary)
    for metric, rows in summary["metrics"].items():
        matched = any("diff_ci_matched" in row for row in rows.values())
        lines += ["", _table_heading(summary, metric), "",
                  "| condition | seeds | mean | 95% CI | per seed | Δ vs baseline | Δ 95% CI (questions) | "
                  "Δ 95% CI (seeds+questions) |" + (" Δ 95% CI (matched seeds) |" if matched else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if matched else "")]
        for name, row in rows.items():
            lines.append(
                f"| {name} | {row['n_seeds']} | {_fmt(row['mean'])} | {_fmt_ci(row['ci'], signed=False)} | "
                f"{_per_seed(summary, name, row)} | {row['diff']:+.4f} | {_fmt_ci(row['diff_ci'])} | "
                f"{_fmt_ci(row.get('diff_ci_two_level'))} |"
                + (f" {_fmt_ci(row.get('diff_ci_matched'))} |" if matched else "")
            )
        lines += _sampling_line(summary, metric) + _resolution_line(summary, rows)
    inter = summary.get("interaction")
    if inter:
        cells = ", ".join(f"{k}={v}" for k, v in inter["cells"].items())
        matched = any("ci_matched" in e for e in inter["metrics"].values())
        extra, rule = (" 95% CI (matched seeds) |", "---|") if matched else ("", "")
        lines += ["", "## 2x2 interaction", "", f"Cells: {cells}. Interaction = {inter['formula']}.", "",
                  "| metric | interaction | 95% CI (questions) | 95% CI (seeds+questions) |" + extra,
                  "|---|---|---|---|" + rule]
        for metric, e in inter["metrics"].items():
            lines.append(f"| {metric} | {e['value']:+.4f} | {_fmt_ci(e['ci'])} | {_fmt_ci(e.get('ci_two_level'))} |"
                         + (f" {_fmt_ci(e.get('ci_matched'))} |" if matched else ""))
        if any(e.get("mde") is not None for e in inter["metrics"].values()):
            p = summary["power"]
            lines += ["", f"Smallest resolvable interaction ({p['power']:.0%} power, two-sided α = {p['alpha']:.2g}):",
                      "", "| metric | questions | seeds+questions |" + (" matched seeds |" if matched else ""),
                      "|---|---|---|" + rule]
            for metric, e in inter["metrics"].items():
                lines.append(f"| {metric} | {_fmt(e.get('mde'))} | {_fmt(e.get('mde_two_level'))} |"
                             + (f" {_fmt(e.get('mde_matched'))} |" if matched else ""))
        lines += _main_effects_section(inter, matched)
    lines += _fixed_broken_section(summary)
    return "\n".join(lines) + "\n"


def render_failures_markdown(rows: list[dict]) -> str:
    lines = ["# Failure cases", "", "A fixed-seed sample of unsuccessful questions per condition and seed.", ""]
    for r in rows:
        lines += [f"## {r['condition']} @ {r['seed']} — {r['id']}", "",
                  f"- question: {r['question']}", f"- GT: {r['gt']} (hits {r['gt_hits']})",
                  f"- final answer: {r['final_answer']!r}", f"- tool calls: {r['n_tool_calls']}", "",
                  "```text", str(r["text"]), "```", ""]
    return "\n".join(lines)


SUMMARY_FILES = ("summary.json", "summary.md", "failures.jsonl", "failures.md")


def is_summary_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds only what :func:`write_summary` writes (and its temporary files), so
    ``--overwrite`` may replace it."""
    def ours(entry: Path) -> bool:
        leftover = entry.name.startswith(".") and entry.name.endswith(".tmp") \
            and any(entry.name.startswith(f".{name}.") for name in SUMMARY_FILES)
        return entry.is_file() and not entry.is_symlink() and (entry.name in SUMMARY_FILES or leftover)

    return all(ours(entry) for entry in Path(folder).iterdir())


def write_summary(output_dir: str | os.PathLike, summary: dict, failures: list[dict], overwrite: bool = False,
                  sources: Iterable[str | os.PathLike] = ()) -> Path:
    """Write summary.json, summary.md, failures.jsonl and failures.md (atomically), the folder locked.

    The folder must be new or empty, or with ``overwrite`` an earlier summary (:func:`is_summary_folder`);
    never one of ``sources`` (the eval folders), a folder above them, or a run, eval, sweep or demo
    folder (:mod:`minimind_trl.targets`)."""
    out = Path(output_dir)
    try:
        with writing(out, "minimind-trl summarize", sources=sources, reuse=is_summary_folder if overwrite else None,
                     expect="an earlier summary"):
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "summary.json", summary, sort_keys=True)
            write_text_atomic(out / "summary.md", render_markdown(summary))
            write_jsonl_atomic(out / "failures.jsonl", failures, sort_keys=True, compact=False)
            write_text_atomic(out / "failures.md", render_failures_markdown(failures))
    except TargetNotEmptyError as exc:
        hint = "" if overwrite else " (use --overwrite to replace an earlier summary)"
        raise OutputDirNotEmptyError(f"{exc}{hint}") from None
    except OutputTargetError as exc:
        raise EvalError(str(exc)) from None
    return out
