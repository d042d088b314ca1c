"""Acceptance (issue 14): a real tiny-moe GRPO run's metrics.jsonl draws the router figures.

The run generates with the model itself (no scripted rollout), trains two steps (one rollout,
K = 2, so the second step has a routing flip rate) and records with the trainer's own
:class:`~minimind_trl.trainer.recorder.StepRecorder`; the figures are drawn from that file by
:func:`minimind_trl.eval.plots.plot_runs`. No key is written by hand here: what each figure must
hold is read from the file and from the model's config.
"""

from __future__ import annotations

import pytest
from helpers import make_trainer, tiny_model

from minimind_trl.eval import plots
from minimind_trl.metric_names import (
    AUX_LOSS,
    MOE_ALL_FLIP_RATE,
    MOE_AUX_LOSS,
    MOE_FLIP_RATE,
    MOE_IMBALANCE,
    MOE_MAX_IMBALANCE,
    MOE_PREFIX,
    MOE_ROUTER_ENTROPY,
    POLICY_FIGURES,
    ROUTER_FIGURES,
    moe_layer_key,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("moe-run")
    model = tiny_model(moe=True)
    assert model.config.use_moe
    trainer = make_trainer(run_dir, scripted=False, model=model, max_steps=2, num_iterations=2)
    trainer.train()
    return run_dir, model.config.num_hidden_layers


@pytest.fixture(scope="module")
def drawn(moe_run, tmp_path_factory):
    """(figure stem -> legend labels of its lines, written paths), from plot_runs on the run folder."""
    run_dir, _ = moe_run
    labels: dict[str, list[str]] = {}
    save = plots._save

    def recording_save(fig, path):
        legend = fig.axes[0].get_legend()
        labels[path.stem] = [text.get_text() for text in legend.get_texts()] if legend else []
        return save(fig, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_save", recording_save)
        written = plots.plot_runs([run_dir], tmp_path_factory.mktemp("figures"))
    return labels, written


def test_router_figures_are_drawn_from_the_keys_the_trainer_wrote(moe_run, drawn):
    run_dir, layers = moe_run
    labels, written = drawn
    _, rows = plots.load_run_metrics(run_dir)
    written_keys = plots.plottable_keys(rows)
    router_keys = [k for k in written_keys if k.startswith(MOE_PREFIX)]
    assert router_keys, "the trainer wrote no router keys"

    by_stem = {path.stem: path for path in written}
    for group in ROUTER_FIGURES:
        assert group.stem in by_stem, f"{group.stem}.png was not drawn"
        data = by_stem[group.stem].read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000
        assert labels[group.stem] == group.select(written_keys)  # one line per written key, nothing else
        assert set(labels[group.stem]) <= set(written_keys)
    # every router key the trainer wrote is in a router figure (the per-expert load is a list)
    assert sorted(k for stem in ("router_load", "router_entropy", "router_flip", "aux_loss")
                  for k in labels[stem] if k.startswith(MOE_PREFIX)) == router_keys
    # and each figure holds every layer of the model
    for layer in range(layers):
        assert moe_layer_key(layer, MOE_IMBALANCE) in labels["router_load"]
        assert moe_layer_key(layer, MOE_ROUTER_ENTROPY) in labels["router_entropy"]
        assert moe_layer_key(layer, MOE_FLIP_RATE) in labels["router_flip"]
        assert moe_layer_key(layer, MOE_AUX_LOSS) in labels["aux_loss"]
    assert MOE_MAX_IMBALANCE in labels["router_load"] and MOE_ALL_FLIP_RATE in labels["router_flip"]
    assert AUX_LOSS in labels["aux_loss"]
    per_step = {stem: keys for stem, keys in labels.items() if stem not in ("by_update", "replay")}
    assert plots.figure_keys(rows) == per_step


def test_policy_figures_hold_no_router_key(drawn):
    labels, _ = drawn
    policy = {group.stem for group in POLICY_FIGURES} & set(labels)
    assert {"loss", "entropy", "ratio", "reward"} <= policy
    for stem in policy:
        assert not [k for k in labels[stem] if k.startswith(MOE_PREFIX) or k == AUX_LOSS], stem
