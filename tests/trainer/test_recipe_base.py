"""Recipe ``base:`` chains and the training-kind registry.

A recipe may name a base recipe and list only what differs (mappings merge, lists and scalars
replace); cycles, missing files, bad values and over-long chains are one line naming the file. The
shipped recipes resolve to exactly the dicts (and hashes) they resolved to before they used bases
(tests/golden/recipes_resolved.json, captured from the loader before the rewrite). Kinds are a
registry: a registered kind's sections, checks, config and trainer are what the loader and the
builders use, and the objective section's keys come from ``ObjectiveConfig`` itself.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from helpers import tiny_tokenizer_path

from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import write_jsonl_atomic
from minimind_trl.objectives import ObjectiveConfig
from minimind_trl.trainer import build, cli
from minimind_trl.trainer.kinds import TrainingKind, get_kind, grpo, register_kind, registry
from minimind_trl.trainer.recipe import (
    MAX_BASE_CHAIN,
    SCHEMA,
    RecipeError,
    load_recipe,
    merge_recipes,
    read_recipe_file,
    recipe_sha256,
    validate_recipe,
)
from minimind_trl.trainer.recipe_schema import REQUIRED

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "recipes_resolved.json"

GRPO = {
    "kind": "grpo",
    "model": {"preset": "tiny"},
    "data": {"path": "splits"},
    "rollout": {"group_size": 4, "tool_names": ["calculate_math"]},
    "rewards": ["success_reward", {"name": "format_reward", "weight": 0.5}],
    "peft": {"target_modules": ["q_proj"]},
    "training": {"use_cpu": True, "bf16": False, "report_to": [], "learning_rate": 1e-5},
}


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ the shipped recipes


def test_every_shipped_recipe_resolves_to_exactly_what_it_did_before_bases():
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert sorted(golden) == sorted(str(p.relative_to(RECIPES)) for p in RECIPES.rglob("*.yaml"))
    for name, entry in golden.items():
        recipe = load_recipe(RECIPES / name)
        assert recipe == entry["recipe"], name
        assert list(recipe) == list(entry["recipe"]), name  # the manifest's key order too
        assert recipe_sha256(recipe) == entry["recipe_sha256"], name


def test_the_near_copies_say_only_what_differs():
    """The conditions that share a protocol name a base; the base of each chain is a whole recipe."""
    based = {str(p.relative_to(RECIPES)): yaml.safe_load(p.read_text(encoding="utf-8")).get("base")
             for p in RECIPES.rglob("*.yaml")}
    for name in ("e1/cispo.yaml", "e1/dr_grpo.yaml", "e1/gspo.yaml", "e2/center_seq_mean.yaml",
                 "e2/zscore_fixed_length.yaml", "e3/grpo.yaml", "e3/cispo.yaml", "e3/dr_grpo.yaml", "e3/gspo.yaml",
                 "e4/grpo_reward_model.yaml", "extra/grpo_lora.yaml", "extra/sft_lora.yaml"):
        assert based[name], name
        lines = [line for line in (RECIPES / name).read_text().splitlines() if line.strip() and line[0] != "#"]
        assert len(lines) < 40, (name, len(lines))
    assert based["e1/grpo.yaml"] is None and based["e0/sft.yaml"] is None


# ----------------------------------------------------------------------------------- base merging


def test_a_base_is_merged_mappings_deep_lists_whole(tmp_path):
    base = write(tmp_path / "e1" / "grpo.yaml", GRPO)
    child = write(tmp_path / "e9" / "child.yaml", {
        "base": "../e1/grpo.yaml",
        "description": "child",
        "objective": {"preset": "cispo"},
        "rollout": {"group_size": 8},  # merged: tool_names stays the base's
        "rewards": ["coverage_reward"],  # a list: replaces the base's whole
        "training": {"learning_rate": 2e-5},
    })
    recipe = load_recipe(child)
    assert recipe["description"] == "child" and recipe["objective"]["preset"] == "cispo"
    assert recipe["rollout"]["group_size"] == 8 and recipe["rollout"]["tool_names"] == ["calculate_math"]
    assert recipe["rewards"] == [{"name": "coverage_reward", "weight": 1.0, "options": {}}]
    assert recipe["training"] == {**GRPO["training"], "learning_rate": 2e-5}
    assert recipe["peft"]["target_modules"] == ["q_proj"] and "base" not in recipe
    assert load_recipe(base)["objective"]["preset"] == "grpo"  # the base file itself is unchanged


def test_null_turns_a_base_section_off_and_overrides_apply_after_the_merge(tmp_path):
    write(tmp_path / "base.yaml", GRPO)
    child = write(tmp_path / "child.yaml", {"base": "base.yaml", "peft": None, "rollout": {"group_size": 8}})
    assert "peft" not in load_recipe(child)
    recipe = load_recipe(child, ["rollout.group_size=2", "rewards.1.weight=2", "training.learning_rate=3e-4"])
    assert recipe["rollout"]["group_size"] == 2 and recipe["rewards"][1]["weight"] == 2
    assert recipe["training"]["learning_rate"] == 3e-4 and recipe["rollout"]["tool_names"] == ["calculate_math"]
    with pytest.raises(RecipeError, match="unknown key base .*--set cannot name one"):
        load_recipe(child, ["base=other.yaml"])


def test_an_empty_section_over_a_base_is_refused_naming_the_file_and_key(tmp_path):
    """``training:`` left with every line under it commented out is YAML null, and null replaces a
    base's whole value: the child would silently train at every default. Refused, except for ``peft``
    (null turns LoRA off, documented); an empty mapping ``{}`` and a null scalar stay fine."""
    write(tmp_path / "base.yaml", {**GRPO, "model": {"preset": "tiny", "config": {"num_hidden_layers": 1}}})
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\ntraining:\n  # learning_rate: 3e-4\n", encoding="utf-8")
    with pytest.raises(RecipeError) as raised:
        load_recipe(child)
    assert str(raised.value).startswith(f"{child}: training is empty (null)"), raised.value
    assert "base base.yaml" in str(raised.value)
    nested = write(tmp_path / "nested.yaml", {"base": "base.yaml", "model": {"config": None}})
    with pytest.raises(RecipeError, match=r"nested.yaml: model.config is empty \(null\)"):
        load_recipe(nested)
    fine = write(tmp_path / "fine.yaml", {"base": "base.yaml", "training": {}, "data": {"max_rows": None},
                                          "peft": None})
    recipe = load_recipe(fine)
    assert recipe["training"]["learning_rate"] == 1e-5 and "peft" not in recipe
    assert recipe["model"]["config"] == {"num_hidden_layers": 1}


def test_a_chain_of_bases(tmp_path):
    write(tmp_path / "a.yaml", GRPO)
    write(tmp_path / "sub" / "b.yaml", {"base": "../a.yaml", "seed": 7, "rollout": {"group_size": 6}})
    c = write(tmp_path / "sub" / "deeper" / "c.yaml", {"base": "../b.yaml", "rollout": {"max_tool_turns": 1}})
    recipe = load_recipe(c)
    assert recipe["seed"] == 7 and recipe["rollout"]["group_size"] == 6 and recipe["rollout"]["max_tool_turns"] == 1
    raw = read_recipe_file(c)
    assert "base" not in raw and raw["rollout"] == {**GRPO["rollout"], "group_size": 6, "max_tool_turns": 1}


def test_merge_is_a_new_dict():
    base = {"a": {"b": [1, 2], "c": 1}, "d": 1}
    merged = merge_recipes(base, {"a": {"b": [3]}, "d": None})
    assert merged == {"a": {"b": [3], "c": 1}, "d": None}
    assert base == {"a": {"b": [1, 2], "c": 1}, "d": 1}
    merged["a"]["c"] = 5
    assert base["a"]["c"] == 1


@pytest.mark.parametrize("files, start, message", [
    ({"a.yaml": {"base": "b.yaml"}, "b.yaml": {"base": "a.yaml"}}, "a.yaml", "b.yaml: base a.yaml: a cycle of bases"),
    ({"a.yaml": {"base": "a.yaml"}}, "a.yaml", "a.yaml: base a.yaml: a cycle of bases"),
    ({"a.yaml": {"base": "nowhere/b.yaml"}}, "a.yaml", "a.yaml: base nowhere/b.yaml: no such file"),
    ({"a.yaml": {"base": ["b.yaml"]}}, "a.yaml", "a.yaml: base must be the path of a recipe file"),
    ({"a.yaml": {"base": ""}}, "a.yaml", "a.yaml: base must be the path of a recipe file"),
    ({"a.yaml": {"base": "b.yaml"}, "b.yaml": [1, 2]}, "a.yaml", "b.yaml: a base must hold a mapping"),
])
def test_bad_bases_are_one_line_naming_the_file(tmp_path, files, start, message):
    for name, data in files.items():
        write(tmp_path / name, data)
    with pytest.raises(RecipeError) as info:
        load_recipe(tmp_path / start)
    text = str(info.value)
    assert "\n" not in text and message in text, text
    assert text.startswith(str(tmp_path)), text  # the file whose base is at fault comes first


def test_invalid_yaml_in_a_base_names_the_base(tmp_path):
    (tmp_path / "b.yaml").write_text("kind: [\n")
    write(tmp_path / "a.yaml", {"base": "b.yaml"})
    with pytest.raises(RecipeError, match=r"b\.yaml: not valid YAML"):
        load_recipe(tmp_path / "a.yaml")


def test_chains_are_bounded(tmp_path):
    write(tmp_path / "r0.yaml", GRPO)
    for i in range(1, MAX_BASE_CHAIN + 1):
        write(tmp_path / f"r{i}.yaml", {"base": f"r{i - 1}.yaml", "seed": i})
    assert load_recipe(tmp_path / f"r{MAX_BASE_CHAIN - 1}.yaml")["seed"] == MAX_BASE_CHAIN - 1  # MAX files: fine
    with pytest.raises(RecipeError, match=f"more than {MAX_BASE_CHAIN} files in one chain of bases"):
        load_recipe(tmp_path / f"r{MAX_BASE_CHAIN}.yaml")


def test_the_cli_reports_a_bad_base_in_one_line_exit_2(tmp_path, capsys):
    child = write(tmp_path / "child.yaml", {"base": "missing.yaml"})
    assert cli.main([str(child), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"minimind-trl train: {child}: base missing.yaml: no such file"), err
    assert not (tmp_path / "run").exists()


def test_the_manifest_records_the_resolved_recipe_of_a_based_file(tmp_path, capsys):
    tasks = generate_tasks(4, seed=5)
    write_jsonl_atomic(tmp_path / "sft" / "train.jsonl", [gold_trajectory(t, default_registry()) for t in tasks])
    write(tmp_path / "base.yaml", {
        "kind": "sft", "seed": 1, "model": {"preset": "tiny"}, "tokenizer": {"path": tiny_tokenizer_path()},
        "data": {"path": str(tmp_path / "sft"), "verify": False}, "sft": {"max_length": 2048},
        "training": {"use_cpu": True, "bf16": False, "report_to": [], "max_steps": 1, "logging_steps": 1,
                     "per_device_train_batch_size": 2, "learning_rate": 1e-3, "save_strategy": "no",
                     "disable_tqdm": True, "activation_checkpointing": False},
    })
    child = write(tmp_path / "child.yaml", {"base": "base.yaml", "description": "from a base",
                                            "training": {"learning_rate": 5e-4}})
    overrides = ["training.max_steps=2"]
    assert cli.main([str(child), "--output-dir", str(tmp_path / "run"), "--set", overrides[0]]) == 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    expected = load_recipe(child, overrides)
    assert manifest["recipe"] == expected and "base" not in manifest["recipe"]
    assert manifest["recipe"]["training"]["learning_rate"] == 5e-4 and manifest["recipe"]["training"]["max_steps"] == 2
    assert manifest["recipe_sha256"] == recipe_sha256(expected)
    # the base is part of the recipe: a changed base is a different recipe, which --resume refuses
    base = yaml.safe_load((tmp_path / "base.yaml").read_text())
    write(tmp_path / "base.yaml", {**base, "sft": {"max_length": 1024}})
    args = [str(child), "--output-dir", str(tmp_path / "run"), "--set", overrides[0], "--resume"]
    assert cli.main(args) == 2
    assert "--resume: the recipe differs from the run's manifest" in capsys.readouterr().err


# --------------------------------------------------------------------------------- the kinds


def test_the_objective_section_is_objective_config_s_fields():
    fields = [f.name for f in dataclasses.fields(ObjectiveConfig)]
    assert list(SCHEMA["objective"]) == ["preset", *fields]
    assert SCHEMA["objective"]["beta"] == 0.0 and SCHEMA["objective"]["policy"] is None


def test_a_new_objective_config_field_becomes_a_recipe_key(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Wider(ObjectiveConfig):
        entropy_bonus: float = 0.0
        new_knob: int | None = None

    monkeypatch.setattr(grpo, "ObjectiveConfig", Wider)
    monkeypatch.setattr(grpo, "OBJECTIVE_PRESETS", {**grpo.OBJECTIVE_PRESETS, "wide": {"new_knob": 3}})
    section = grpo.objective_section()
    assert section["entropy_bonus"] == 0.0 and section["new_knob"] is None  # a preset sets new_knob: null = preset's
    assert list(section)[-2:] == ["entropy_bonus", "new_knob"]


@dataclasses.dataclass
class ToyConfig:
    output_dir: str
    seed: int
    learning_rate: float = 1.0
    world_size: int = 1


@pytest.fixture
def toy_kind(monkeypatch):
    monkeypatch.setattr(registry, "_KINDS", dict(registry._KINDS))
    built = []

    def make_trainer(recipe, config, model, tokenizer, rows, eval_rows):
        built.append((recipe["toy"]["size"], config.learning_rate, rows, eval_rows))
        return "a toy trainer"

    def check(recipe, raw):
        if recipe["toy"]["size"] > 10:
            raise RecipeError("recipe: toy.size is too large")

    return register_kind(TrainingKind(
        name="toy", config_class=ToyConfig,
        make_config=lambda recipe, run_dir, processes: ToyConfig(run_dir, recipe["seed"], **recipe["training"]),
        make_dataset=lambda recipe, rows, tokenizer: rows, make_trainer=make_trainer,
        sections={"toy": {"size": 2, "name": REQUIRED}}, owned_training_keys={"world_size": "the launcher"},
        check=check, takes_eval_split=True,
    )), built


def test_a_registered_kind_is_validated_and_built_through_the_registry(toy_kind, tmp_path):
    kind, built = toy_kind
    raw = {"kind": "toy", "model": {"preset": "tiny"}, "data": {"path": "d", "eval_split": "val"},
           "toy": {"name": "t"}, "training": {"learning_rate": 0.5}}
    recipe = validate_recipe(raw)
    assert recipe["toy"] == {"size": 2, "name": "t"} and recipe["data"]["eval_split"] == "val"
    assert get_kind("toy") is kind
    config = build.training_config(recipe, str(tmp_path))
    assert isinstance(config, ToyConfig) and config.learning_rate == 0.5
    assert build.build_trainer(recipe, config, None, None, [1], [2]) == "a toy trainer"
    assert built == [(2, 0.5, [1], [2])]
    for change, message in [
        ({"toy": {}}, "toy.name is required"),
        ({"toy": {"name": "t", "size": 11}}, "toy.size is too large"),
        ({"training": {"world_size": 2}}, "training.world_size is set elsewhere: use the launcher"),
        ({"training": {"epochs": 2}}, "unknown key training.epochs (not a field of the toy training config)"),
        ({"rollout": {}}, "section 'rollout' is not used by kind 'toy'"),
        ({"rewards": ["success_reward"]}, "rewards is only used by kind 'grpo'"),
        ({"peft": {"target_modules": ["q_proj"]}}, "section 'peft' is not used by kind 'toy'"),
    ]:
        with pytest.raises(RecipeError) as info:
            validate_recipe({**raw, **change})
        assert message in str(info.value), (change, str(info.value))
    with pytest.raises(RecipeError, match=r"data\.eval_split is for kinds grpo, sft and toy, not 'dpo'"):
        validate_recipe({"kind": "dpo", "model": {"preset": "tiny"}, "data": {"path": "x", "eval_split": "val"}})
    with pytest.raises(RecipeError, match=r"kind must be one of \('grpo', 'sft', 'dpo', 'distill', 'reward', 'toy'\)"):
        validate_recipe({**raw, "kind": "ppo"})


def test_a_kind_is_registered_once(toy_kind):
    kind, _ = toy_kind
    with pytest.raises(ValueError, match="already registered"):
        register_kind(kind)
    assert register_kind(dataclasses.replace(kind, takes_eval_split=False), replace=True) is get_kind("toy")
    assert get_kind("toy").takes_eval_split is False


def test_the_manifest_objective_is_the_kind_s(tmp_path):
    recipe = validate_recipe(GRPO)
    config = get_kind("grpo").make_config(recipe, str(tmp_path / "run"), 1)
    assert get_kind("grpo").manifest_objective(config) == config.objective_dict()
    assert get_kind("sft").manifest_objective(config) is None


def test_each_kind_builds_its_dataset_from_split_rows():
    tasks = generate_tasks(3, seed=2)
    grpo = validate_recipe({**GRPO, "rollout": {"thinking_ratio": 0.0}})
    rows = get_kind("grpo").make_dataset(grpo, tasks, None)
    assert rows.column_names == ["prompt", "gt", "id", "open_thinking"] and len(rows) == 3
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    distill = validate_recipe({"kind": "distill", "model": {"preset": "tiny"}, "data": {"path": "d"},
                               "distill": {"teacher_path": "t"}})
    prompts = get_kind("distill").make_dataset(distill, tasks, None)
    assert prompts.column_names == ["prompt"] and prompts[0]["prompt"][-1]["role"] == "user"
    with pytest.raises(RecipeError, match="needs 'conversations' and 'gt'"):
        get_kind("grpo").make_dataset(grpo, [{"conversations": []}], None)
