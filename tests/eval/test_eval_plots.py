"""`plot`: PNG training curves from recorded metrics.jsonl files, bad input errors."""

import json

import pytest

from minimind_trl.eval.cli import plot_main
from minimind_trl.eval.errors import EvalError
from minimind_trl.eval.plots import figure_keys, plot_runs, plot_summary
from minimind_trl.metric_names import (
    COUNT_ASSIGN,
    COUNT_ENTROPY_SUM,
    COUNT_FLIP_TOKENS,
    COUNT_FLIPS,
    COUNT_PROB_SUM,
    COUNT_TOKENS,
    TRAINING_FIGURES,
    router_count_key,
)
from minimind_trl.trainer.moe import finalize_counts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def moe_figures(flips: int) -> dict:
    """What finalize_counts turns a 2-layer, 4-expert step's summed router counts into."""
    sums = {}
    for layer in (0, 1):
        sums.update({router_count_key(layer, COUNT_TOKENS): 10.0, router_count_key(layer, COUNT_ENTROPY_SUM): 12.0,
                     router_count_key(layer, COUNT_FLIPS): float(flips),
                     router_count_key(layer, COUNT_FLIP_TOKENS): 8.0})
        sums.update({router_count_key(layer, COUNT_ASSIGN, e): float(e + 1) for e in range(4)})
        sums.update({router_count_key(layer, COUNT_PROB_SUM, e): 2.5 for e in range(4)})
    return finalize_counts(sums, 4)


def write_metrics(run_dir, k=2, rollouts=4, moe=False):
    """A recorded-looking metrics.jsonl: K updates per rollout, ratio drifting from 1 after update 0."""
    run_dir.mkdir(parents=True)
    rows = []
    for r in range(rollouts):
        for u in range(k):
            row = {
                "step": r * k + u, "rollout": r, "update": u,
                "reward_mean": 0.1 * r, "reward_std": 0.05, "task_success": 0.05 * r,
                "ratio_mean": 1.0 + 0.01 * u, "clip_fraction_total": 0.02 * u, "clip_fraction_low": 0.01 * u,
                "kl": 0.001 * r, "grad_norm": 1.0 / (1 + r), "completion_length_mean": 40 + r,
                "tool_calls_per_traj": 1.0 + 0.1 * r, "loss": -0.1 * r, "lr": 1e-5, "note": "text is ignored",
            }
            if moe:  # the trainer's own MoE figures (names from minimind_trl.trainer.moe)
                row.update({"aux_loss": 2.0, **moe_figures(flips=u)})
            rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return run_dir


def test_plot_runs_writes_non_empty_pngs(tmp_path):
    runs = [write_metrics(tmp_path / "grpo"), write_metrics(tmp_path / "moe", moe=True)]
    written = plot_runs(runs, tmp_path / "fig")
    names = {p.name for p in written}
    assert {"reward.png", "task_success.png", "ratio.png", "clip_fraction.png", "kl.png", "grad_norm.png",
            "completion_length.png", "tool_calls.png", "router_load.png", "router_flip.png", "loss.png",
            "learning_rate.png", "by_update.png", "aux_loss.png", "router_entropy.png"} <= names
    for p in written:
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000, p
    assert not list((tmp_path / "fig").glob(".*"))  # no temporary files left behind


def test_replay_figure_draws_one_line_per_update_k_for_runs_with_replay(tmp_path, monkeypatch):
    """replay.png: one panel per replay diagnostic present, x = rollout, one line per k; none at K = 1;
    one figure per run (``replay_<run>.png``) when several runs are drawn."""
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((self.get_title(), kwargs.get("label"), list(args[0]) if args else None))
        return original(self, *args, **kwargs)

    k2, k1 = write_metrics(tmp_path / "k2", k=2, rollouts=3), write_metrics(tmp_path / "k1", k=1, rollouts=3)
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    names = {p.name for p in plot_runs([k2], tmp_path / "one")}
    assert "replay.png" in names
    replay = [(label, xs) for title, label, xs in drawn if title == "" and label and label.startswith("k=")]
    assert replay == [("k=0", [0, 1, 2]), ("k=1", [0, 1, 2])]  # clip_fraction_low: the one replay key written
    assert "replay.png" not in {p.name for p in plot_runs([k1], tmp_path / "k1fig")}
    assert {p.name for p in plot_runs([k2, k1], tmp_path / "two")} >= {"replay_k2.png"}
    assert not (tmp_path / "two" / "replay_k1.png").exists()


def spy_lines_and_bands(monkeypatch) -> tuple[list, list]:
    """Record every line (title, label, xs, ys) and band (title, xs, low, high) matplotlib draws."""
    import matplotlib.axes

    lines, bands = [], []
    plot, fill = matplotlib.axes.Axes.plot, matplotlib.axes.Axes.fill_between

    def spy_plot(self, *args, **kwargs):
        lines.append((self.get_title(), kwargs.get("label"), list(args[0]), list(args[1])))
        return plot(self, *args, **kwargs)

    def spy_fill(self, x, low, high, **kwargs):
        bands.append((self.get_title(), list(x), list(low), list(high)))
        return fill(self, x, low, high, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy_plot)
    monkeypatch.setattr(matplotlib.axes.Axes, "fill_between", spy_fill)
    return lines, bands


def test_conditions_figure_averages_each_rollout_over_its_updates_then_over_seeds(tmp_path, monkeypatch):
    """conditions.png: one line per condition (runs named <condition>-seed<S>), the value per rollout
    is the mean of the rollout's K records, averaged over seeds, with the seeds' min-max band."""
    runs = []
    for name, reward in (("grpo-seed1", 0.0), ("grpo-seed2", 1.0), ("cispo-seed1", 5.0)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        rows = [{"step": 2 * r + u, "rollout": r, "update": u, "reward_mean": reward + r + u,
                 "entropy": 0.5} for r in range(3) for u in range(2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        runs.append(run)
    lines, bands = spy_lines_and_bands(monkeypatch)
    assert "conditions.png" in {p.name for p in plot_runs(runs, tmp_path / "fig")}
    drawn = {(title, label): (xs, ys) for title, label, xs, ys in lines if label and "seed" in label}
    # rollout r, update u: reward + r + u; a rollout's mean over u = 0, 1 is reward + r + 0.5
    assert drawn[("reward_mean", "grpo (2 seeds)")] == ([0, 1, 2], [1.0, 2.0, 3.0])  # seeds 0.5 + r and 1.5 + r
    assert drawn[("reward_mean", "cispo (1 seeds)")] == ([0, 1, 2], [5.5, 6.5, 7.5])
    assert ("reward_mean", [0, 1, 2], [0.5, 1.5, 2.5], [1.5, 2.5, 3.5]) in bands  # grpo's min-max over its seeds
    # grpo on reward_mean and entropy; one seed draws no band (conditions_by_update's bands have x = k = 0, 1)
    assert len([band for band in bands if band[1] == [0, 1, 2]]) == 2
    # a folder not named <condition>-seed<S>, or a single run, draws no conditions figure
    assert "conditions.png" not in {p.name for p in plot_runs([runs[0]], tmp_path / "one")}
    odd = write_metrics(tmp_path / "odd")
    assert "conditions.png" not in {p.name for p in plot_runs([runs[0], odd], tmp_path / "mixed")}


def test_conditions_by_update_figure_averages_over_rollouts_then_seeds_per_k(tmp_path, monkeypatch):
    """conditions_by_update.png: per replay diagnostic, x = update index k, one line per condition:
    each seed's mean over its rollouts at k, then the mean over seeds, with the seeds' min-max band;
    not drawn when every run has K = 1."""

    def write(name, k, scale):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        # rollout r, update u: clip_fraction_low = scale * u * (r + 1); mean over r = 0..2 is 2 * scale * u
        rows = [{"step": k * r + u, "rollout": r, "update": u, "clip_fraction_low": scale * u * (r + 1),
                 "kl_new_old": 0.0} for r in range(3) for u in range(k)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        return run

    runs = [write("grpo_e4-seed1", 3, 1.0), write("grpo_e4-seed2", 3, 2.0), write("cispo-seed1", 3, 0.5)]
    lines, bands = spy_lines_and_bands(monkeypatch)
    assert "conditions_by_update.png" in {p.name for p in plot_runs(runs, tmp_path / "fig")}
    drawn = {label: (xs, ys) for title, label, xs, ys in lines
             if title == "clip_fraction_low" and label and "seeds)" in label and xs == [0, 1, 2]}
    # seeds 1 and 2: 2u and 4u per k; their mean 3u; band [2u, 4u]; cispo's one seed: u
    assert drawn["grpo_e4 (2 seeds)"] == ([0, 1, 2], [0.0, 3.0, 6.0])
    assert drawn["cispo (1 seeds)"] == ([0, 1, 2], [0.0, 1.0, 2.0])
    assert ("clip_fraction_low", [0, 1, 2], [0.0, 2.0, 4.0], [0.0, 4.0, 8.0]) in bands
    k1 = [write("k1-seed1", 1, 1.0), write("k1-seed2", 1, 1.0)]
    assert "conditions_by_update.png" not in {p.name for p in plot_runs(k1, tmp_path / "k1fig")}


def test_condition_figures_keep_each_conditions_colour_in_panels_only_some_conditions_log(tmp_path, monkeypatch):
    """GSPO's sequence clip is logged by GSPO runs only: in its panel GSPO's line keeps GSPO's colour
    from the shared panels (not the first colour, which is another condition's), and that panel has its
    own legend; in conditions.png too."""
    from minimind_trl.eval import plots

    def write(name, gspo):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        rows = [{"step": 2 * r + u, "rollout": r, "update": u, "kl_new_old": 0.1 * u, "clip_fraction": 0.0,
                 **({"gspo_seq_clip_fraction": 0.2 * u} if gspo else {})} for r in range(2) for u in range(2)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
        return run

    figures, save = {}, plots._save

    def keep(fig, path):
        figures[path.name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_runs([write("grpo-seed1", False), write("cispo-seed1", False), write("gspo-seed1", True)],
                    tmp_path / "fig")
    by_update = {ax.get_title(): ax for ax in figures["conditions_by_update.png"].axes}
    colour = {line.get_label(): line.get_color() for line in by_update["kl_new_old"].lines}
    assert len(set(colour.values())) == 3
    (gspo_line,) = by_update["gspo_seq_clip_fraction"].lines
    assert gspo_line.get_label() == "gspo (1 seeds)" and gspo_line.get_color() == colour["gspo (1 seeds)"]
    assert by_update["gspo_seq_clip_fraction"].get_legend() is not None
    assert by_update["kl_new_old"].get_legend() is not None  # the first panel with all three names them
    conditions = {ax.get_title(): ax for ax in figures["conditions.png"].axes}
    assert {line.get_label(): line.get_color() for line in conditions["kl_new_old"].lines} == colour
    assert conditions["kl_new_old"].get_legend() is not None and conditions["clip_fraction"].get_legend() is None


def test_plot_only_present_keys(tmp_path):
    run = tmp_path / "dense"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.5}) + "\n"
                                       + json.dumps({"step": 1, "reward_mean": 0.7}) + "\n")
    written = plot_runs([run / "metrics.jsonl"], tmp_path / "fig")
    assert [p.name for p in written] == ["reward.png"]


def test_plot_bad_input(tmp_path, capsys):
    with pytest.raises(EvalError, match="no metrics.jsonl"):
        plot_runs([tmp_path / "nope"], tmp_path / "fig")
    run = tmp_path / "odd"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "unknown_key": 1.0}) + "\n")
    with pytest.raises(EvalError, match="no plottable keys"):
        plot_runs([run], tmp_path / "fig")
    (run / "metrics.jsonl").write_text("{not json\n")
    with pytest.raises(EvalError, match="not valid JSON"):
        plot_runs([run], tmp_path / "fig")
    with pytest.raises(EvalError, match="summary not found"):
        plot_summary(tmp_path / "missing.json", tmp_path / "fig")
    assert plot_main(["--output-dir", str(tmp_path / "fig")]) == 2
    assert plot_main(["--runs", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "fig")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("minimind-trl plot: error:") for line in err)


def test_plot_cli_runs(tmp_path):
    run = write_metrics(tmp_path / "run", k=3)
    assert plot_main(["--runs", str(run), "--output-dir", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig" / "by_update.png").stat().st_size > 2000


def test_plot_cli_replaces_the_figures_folder_whole_or_not_at_all(tmp_path):
    run = write_metrics(tmp_path / "run", k=3)
    fig = tmp_path / "fig"
    fig.mkdir()
    (fig / "stale.png").write_bytes(b"old figure")
    assert plot_main(["--runs", str(run), "--output-dir", str(fig)]) == 0
    assert not (fig / "stale.png").exists() and (fig / "by_update.png").is_file()  # a new folder, swapped in
    before = sorted(p.name for p in fig.iterdir())
    # the run figures draw, then the summary fails: the old folder stays as it was, no staging left
    assert plot_main(["--runs", str(run), "--summary", str(tmp_path / "missing.json"), "--output-dir", str(fig)]) == 2
    assert sorted(p.name for p in fig.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig", "run"]


def test_moe_figures_take_the_trainers_keys_and_only_them():
    keys = [k for k, v in moe_figures(flips=1).items() if isinstance(v, float)] + ["aux_loss", "entropy",
                                                                                    "policy_loss", "loss"]
    drawn = {group.stem: sorted(group.select(keys)) for group in TRAINING_FIGURES}
    assert drawn["router_load"] == ["moe/layer0/imbalance", "moe/layer1/imbalance", "moe/max_imbalance"]
    assert drawn["router_entropy"] == ["moe/layer0/router_entropy", "moe/layer1/router_entropy"]
    assert drawn["router_flip"] == ["moe/flip_rate", "moe/layer0/flip_rate", "moe/layer1/flip_rate"]
    assert drawn["aux_loss"] == ["aux_loss", "moe/layer0/aux_loss", "moe/layer1/aux_loss"]
    assert drawn["entropy"] == ["entropy"] and drawn["loss"] == ["loss", "policy_loss"]  # no router key


def test_figure_keys_names_what_plot_runs_draws(tmp_path):
    run = write_metrics(tmp_path / "moe", moe=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    drawn = figure_keys(rows)
    written = {p.stem for p in plot_runs([run], tmp_path / "fig")}
    assert set(drawn) | {"by_update", "replay"} == written
    assert drawn["router_load"] == ["moe/layer0/imbalance", "moe/layer1/imbalance", "moe/max_imbalance"]
    assert "note" not in {k for keys in drawn.values() for k in keys}  # text is not plottable
