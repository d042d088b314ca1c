"""PNG figures (matplotlib, Agg backend) from training metrics and evaluation summaries.

Training curves (:func:`plot_runs`) read ``metrics.jsonl`` of one or more run folders. Each record
may carry ``step`` (x axis; the record's position when absent), ``rollout`` and ``update``
(0..K-1, the replay update within a rollout). A figure is drawn only when at least one of its
keys is present in some run; every matching key of every run becomes one line. The groups and
their key patterns are :data:`minimind_trl.metric_names.TRAINING_FIGURES` (built from the same
names the trainer writes with; :func:`figure_keys` says which keys a run's figures draw):

    reward.png             reward_mean, reward_std, reward_min, reward_max, reward/<name>
    task_success.png       task_success*, success_rate*
    ratio.png              ratio_mean, ratio_min, ratio_max
    clip_fraction.png      clip_fraction*
    kl.png                 kl, kl_*
    grad_norm.png          grad_norm
    loss.png               loss, policy_loss (and other *_loss outside moe/)
    entropy.png            entropy (the policy's; not the router's)
    completion_length.png  *length*
    tool_calls.png         tool_* (e.g. tool_calls_per_trajectory)
    aux_loss.png           aux_loss, moe/layer{i}/aux_loss          (MoE router figures:
    router_load.png        moe/layer{i}/imbalance, moe/max_imbalance  minimind_trl.trainer.moe)
    router_entropy.png     moe/layer{i}/router_entropy
    router_flip.png        moe/flip_rate, moe/layer{i}/flip_rate
    learning_rate.png      lr, learning_rate
    by_update.png          ratio_* and clip_fraction* averaged per update index (needs `update`)
    replay.png             per replay update k = 0..K-1, against the rollout: clip fractions (token
                           low / high, GSPO's sequence clip, CISPO's cap), CISPO's largest weight,
                           ratio std and ESS, sequence-ratio std, KL(new || old), entropy
                           (runs with K > 1; ``replay_<run>.png`` when several runs are drawn)
    conditions.png         reward, tool calls, length, entropy, KL(new || old), clip fraction per
                           rollout: one line per condition (mean over its seeds, min-max band);
                           drawn when the runs are named ``<condition>-seed<S>`` and form several
                           conditions or seeds (a sweep's or the demo's runs/ folder)
    conditions_by_update.png
                           the replay diagnostics of replay.png against the update index k: per
                           condition, each seed's mean over rollouts at k, then the mean over
                           seeds (band: min-max); same naming rule, at least one run with K > 1

Evaluation bars (:func:`plot_summary`) read a ``summary.json``: for every metric,
``eval_<metric>.png`` (condition means with 95 % CI whiskers; the two-level CI when the condition
has several seeds) and ``eval_<metric>_diff.png`` (difference to the baseline with its paired CI).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from minimind_trl.eval.errors import EvalError  # noqa: E402
from minimind_trl.fsio import DataFormatError, read_jsonl  # noqa: E402
from minimind_trl.metric_names import (  # noqa: E402
    BY_UPDATE_PATTERN,
    BY_UPDATE_RATIO_PREFIX,
    CONDITION_FIGURE_KEYS,
    INDEX_KEYS,
    REPLAY_FIGURE_KEYS,
    ROLLOUT,
    SEED_SUFFIX,
    STEP,
    TRAINING_FIGURES,
    UPDATE,
)
from minimind_trl.run_folder import METRICS  # noqa: E402


def is_figures_folder(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds only what ``plot`` writes (PNG files), so ``plot`` may replace it whole."""
    return all(entry.is_file() and not entry.is_symlink() and entry.suffix == ".png"
               for entry in Path(folder).iterdir())


def _save(fig, path: Path) -> Path:
    """Render to a temporary PNG beside ``path`` and move it into place."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load_run_metrics(path: str | os.PathLike) -> tuple[str, list[dict]]:
    """(label, records) from a run folder holding metrics.jsonl, or a metrics.jsonl path."""
    p = Path(path)
    file = p / METRICS if p.is_dir() else p
    if not file.is_file():
        raise EvalError(f"no metrics.jsonl at {p}")
    try:
        rows = read_jsonl(file)
    except (DataFormatError, ValueError) as exc:
        raise EvalError(str(exc)) from None
    if not rows:
        raise EvalError(f"{file} holds no records")
    label = file.parent.name if file.name == METRICS else file.stem
    return label, rows


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, r in enumerate(rows):
        if _is_number(r.get(key)):
            xs.append(r[STEP] if _is_number(r.get(STEP)) else i)
            ys.append(float(r[key]))
    return xs, ys


def plottable_keys(rows: list[dict]) -> list[str]:
    """Sorted keys holding a finite number in some record, index keys (step, update, ...) left out."""
    return sorted({k for r in rows for k, v in r.items() if _is_number(v)} - INDEX_KEYS)


def figure_keys(rows: list[dict]) -> dict[str, list[str]]:
    """For one run's records: figure stem -> the keys :func:`plot_runs` draws in it (figures with
    at least one key only; ``by_update`` and ``replay`` not included)."""
    keys = plottable_keys(rows)
    return {group.stem: selected for group in TRAINING_FIGURES if (selected := group.select(keys))}


def plot_runs(run_paths: Sequence[str | os.PathLike], output_dir: str | os.PathLike) -> list[Path]:
    """Training-curve PNGs for every figure group with data; returns the written paths."""
    runs = [load_run_metrics(p) for p in run_paths]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    keys_by_run = [plottable_keys(rows) for _, rows in runs]
    written = []
    for group in TRAINING_FIGURES:
        lines = [(label, rows, k) for (label, rows), keys in zip(runs, keys_by_run) for k in group.select(keys)]
        if not lines:
            continue
        stem, title = group.stem, group.title
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, rows, key in lines:
            xs, ys = _series(rows, key)
            ax.plot(xs, ys, marker="." if len(xs) < 50 else None, label=f"{label}: {key}" if len(runs) > 1 else key)
        ax.set(title=title, xlabel="step (optimizer update)", ylabel=title)
        ax.grid(alpha=0.3)
        _legend(ax, len(lines))
        written.append(_save(fig, out / f"{stem}.png"))
    by_update = _plot_by_update(runs, keys_by_run, out)
    if by_update:
        written.append(by_update)
    by_condition = _runs_by_condition(runs)
    for figure in (_plot_conditions(by_condition, out / "conditions.png"),
                   _plot_conditions_by_update(by_condition, out / "conditions_by_update.png")):
        if figure:
            written.append(figure)
    for label, rows in runs:
        replay = _plot_replay(rows, out / ("replay.png" if len(runs) == 1 else f"replay_{_slug(label)}.png"), label)
        if replay:
            written.append(replay)
    if not written:
        raise EvalError("no plottable keys in the given metrics.jsonl files "
                        "(see the minimind_trl.eval.plots docstring)")
    return written


def _plot_by_update(runs, keys_by_run, out: Path) -> Path | None:
    """Mean of ratio keys (left) and clip-fraction keys (right) per update index k, over rollouts."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    drawn = False
    for (label, rows), keys in zip(runs, keys_by_run):
        for key in (k for k in keys if BY_UPDATE_PATTERN.search(k)):
            means = index_means(rows, key, UPDATE)
            if means:
                ax = axes[0] if key.startswith(BY_UPDATE_RATIO_PREFIX) else axes[1]
                ax.plot(list(means), list(means.values()), marker="o",
                        label=f"{label}: {key}" if len(runs) > 1 else key)
                drawn = True
    if not drawn:
        plt.close(fig)
        return None
    for ax, name in zip(axes, ("importance ratio", "clip fraction")):
        ax.set(title=f"{name} by replay update index", xlabel="update index k within a rollout",
               ylabel="mean over rollouts")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        if ax.lines:
            _legend(ax, len(ax.lines))
    return _save(fig, out / "by_update.png")


def _panels(count: int):
    """A figure of ``count`` panels, three to a row; (figure, the ``count`` axes), the rest hidden."""
    columns = min(3, count)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.2 * rows), squeeze=False)
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat)[:count]


def _legend(ax, lines: int) -> None:
    """Inside the axes for a few lines; beside it, in columns, when a sweep draws many."""
    if lines <= 8:
        ax.legend(fontsize=7)
    else:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 + lines // 25)


def index_means(rows: list[dict], key: str, index: str) -> dict[int, float]:
    """Per value of the record key ``index``: the mean of ``key`` over the records holding it.
    ``ROLLOUT``: each rollout's mean over its K update records; ``UPDATE``: each replay update k's
    mean over the run's rollouts."""
    groups: dict[int, list[float]] = {}
    for r in rows:
        if _is_number(r.get(index)) and _is_number(r.get(key)):
            groups.setdefault(int(r[index]), []).append(float(r[key]))
    return {i: sum(v) / len(v) for i, v in sorted(groups.items())}


def _runs_by_condition(runs: list[tuple[str, list[dict]]]) -> dict[str, list[list[dict]]] | None:
    """Each condition's runs (its seeds' metric rows); None unless every run is named
    ``<condition>-seed<S>`` and there are several runs."""
    by_condition: dict[str, list[list[dict]]] = {}
    for label, rows in runs:
        match = SEED_SUFFIX.match(label)
        if match is None:
            return None
        by_condition.setdefault(match["condition"], []).append(rows)
    return by_condition if len(runs) > 1 else None


def _present(by_condition: dict[str, list[list[dict]]], keys: Sequence[str]) -> list[str]:
    return [k for k in keys if any(_is_number(r.get(k)) for seeds in by_condition.values()
                                   for rows in seeds for r in rows)]


def _condition_colors(by_condition: dict[str, list[list[dict]]]) -> dict[str, str]:
    """One colour per condition for every panel: a panel only some conditions log (GSPO's sequence clip,
    CISPO's weight) draws each in its own colour, not the next in that panel's cycle."""
    return {condition: f"C{i % 10}" for i, condition in enumerate(by_condition)}


def _condition_legends(axes, conditions: int) -> None:
    """A legend on the first panel that draws every condition, and on each panel that draws only some."""
    full = next((ax for ax in axes if len(ax.lines) == conditions), None)
    for ax in axes:
        if ax is full or 0 < len(ax.lines) < conditions:
            _legend(ax, len(ax.lines))


def _mean_and_band(ax, xs: list[int], values: list[list[float]], label: str, color: str) -> None:
    """One line through the means of ``values`` (one list of seeds' values per x), min-max band."""
    ax.plot(xs, [sum(v) / len(v) for v in values], marker="o" if len(xs) < 10 else None, label=label, color=color)
    if any(len(v) > 1 for v in values):
        ax.fill_between(xs, [min(v) for v in values], [max(v) for v in values], color=color, alpha=0.15, linewidth=0)


def _plot_conditions(by_condition: dict[str, list[list[dict]]] | None, path: Path) -> Path | None:
    """:data:`CONDITION_FIGURE_KEYS` against the rollout, one line per condition (mean over seeds,
    min-max band). None without conditions (:func:`_runs_by_condition`)."""
    keys = _present(by_condition, CONDITION_FIGURE_KEYS) if by_condition else []
    if not keys:
        return None
    fig, axes = _panels(len(keys))
    colors = _condition_colors(by_condition)
    for ax, key in zip(axes, keys):
        ax.set(title=key, xlabel="rollout")
        for condition, seeds in by_condition.items():
            per_seed = [index_means(rows, key, ROLLOUT) for rows in seeds]
            rollouts = sorted(set().union(*per_seed))
            if rollouts:
                values = [[m[i] for m in per_seed if i in m] for i in rollouts]
                _mean_and_band(ax, rollouts, values, f"{condition} ({len(seeds)} seeds)", colors[condition])
        ax.grid(alpha=0.3)
    _condition_legends(axes, len(by_condition))
    fig.suptitle("per condition: mean over seeds (band: min-max), each rollout's mean over its K updates")
    fig.tight_layout()
    return _save(fig, path)


def _plot_conditions_by_update(by_condition: dict[str, list[list[dict]]] | None, path: Path) -> Path | None:
    """:data:`REPLAY_FIGURE_KEYS` against the update index k, one line per condition: each seed's
    mean over its rollouts at k, then the mean over seeds (min-max band). None without conditions or
    without a run of K > 1."""
    keys = _present(by_condition, REPLAY_FIGURE_KEYS) if by_condition else []
    if not keys or not any(_is_number(r.get(UPDATE)) and r[UPDATE] > 0
                           for seeds in by_condition.values() for rows in seeds for r in rows):
        return None
    fig, axes = _panels(len(keys))
    colors = _condition_colors(by_condition)
    for ax, key in zip(axes, keys):
        ax.set(title=key, xlabel="update index k within a rollout")
        ax.xaxis.get_major_locator().set_params(integer=True)
        for condition, seeds in by_condition.items():
            per_seed = [index_means(rows, key, UPDATE) for rows in seeds]
            ks = sorted(set().union(*per_seed))
            if ks:
                _mean_and_band(ax, ks, [[m[k] for m in per_seed if k in m] for k in ks],
                               f"{condition} ({len(seeds)} seeds)", colors[condition])
        ax.grid(alpha=0.3)
    _condition_legends(axes, len(by_condition))
    fig.suptitle("per condition and replay update k: mean over rollouts, then over seeds (band: min-max)")
    fig.tight_layout()
    return _save(fig, path)


def _plot_replay(rows: list[dict], path: Path, label: str) -> Path | None:
    """:data:`REPLAY_FIGURE_KEYS` present in ``rows``, one panel each: the key against the rollout
    index, one line per replay update k. None when the run has no update k > 0 (K = 1)."""
    updates = sorted({int(r[UPDATE]) for r in rows if _is_number(r.get(UPDATE)) and _is_number(r.get(ROLLOUT))})
    keys = [k for k in REPLAY_FIGURE_KEYS if any(_is_number(r.get(k)) for r in rows)]
    if len(updates) < 2 or not keys:
        return None
    fig, axes = _panels(len(keys))
    for ax, key in zip(axes, keys):
        for k in updates:
            points = [(r[ROLLOUT], float(r[key])) for r in rows if r.get(UPDATE) == k and _is_number(r.get(key))]
            if points:
                ax.plot(*zip(*points), marker="." if len(points) < 50 else None, label=f"k={k}")
        ax.set(title=key, xlabel="rollout")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{label}: replay diagnostics per update k within each rollout")
    fig.tight_layout()
    return _save(fig, path)


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", metric.replace("@", "_at_")).strip("_")


def _whiskers(values: list[float], cis: list[list[float] | None]) -> list[list[float]]:
    low = [max(0.0, v - ci[0]) if ci else 0.0 for v, ci in zip(values, cis)]
    high = [max(0.0, ci[1] - v) if ci else 0.0 for v, ci in zip(values, cis)]
    return [low, high]


def plot_summary(summary_path: str | os.PathLike, output_dir: str | os.PathLike) -> list[Path]:
    """Bar charts with CI whiskers for every metric in a summary.json; returns the written paths."""
    path = Path(summary_path)
    if path.is_dir():
        path = path / "summary.json"
    if not path.is_file():
        raise EvalError(f"summary not found: {path}")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        table = summary["metrics"]
        baseline = summary["baseline"]
    except (ValueError, KeyError) as exc:
        raise EvalError(f"{path} is not a minimind-trl summary ({exc})") from None
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, rows in table.items():
        names = list(rows)
        means = [rows[n]["mean"] for n in names]
        cis = [rows[n].get("ci_two_level") or rows[n]["ci"] for n in names]
        fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(names) + 2), 4))
        ax.bar(names, means, yerr=_whiskers(means, cis), capsize=4, color="tab:blue", alpha=0.8)
        ax.set(title=f"{metric} (95% CI)", ylabel=metric)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
        written.append(_save(fig, out / f"eval_{_slug(metric)}.png"))

        others = [n for n in names if n != baseline]
        if others:
            diffs = [rows[n]["diff"] for n in others]
            dcis = [rows[n].get("diff_ci_two_level") or rows[n]["diff_ci"] for n in others]
            fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(others) + 2), 4))
            ax.bar(others, diffs, yerr=_whiskers(diffs, dcis), capsize=4, color="tab:orange", alpha=0.8)
            ax.axhline(0.0, color="black", linewidth=0.8)
            ax.set(title=f"{metric}: difference to {baseline} (paired 95% CI)", ylabel=f"Δ {metric}")
            ax.tick_params(axis="x", rotation=30)
            ax.grid(axis="y", alpha=0.3)
            written.append(_save(fig, out / f"eval_{_slug(metric)}_diff.png"))
    return written
