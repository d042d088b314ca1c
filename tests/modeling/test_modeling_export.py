"""Native `.pth` conversion, Hub export (reloaded in a fresh process) and TRL's stock SFTTrainer."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml
from datasets import Dataset
from safetensors import safe_open
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from minimind_trl.modeling import (
    count_parameters,
    get_preset,
    load_native_checkpoint,
    native_key_shapes,
    save_for_hub,
    save_native_checkpoint,
)
from minimind_trl.modeling.configuration_minimind import MiniMindConfig
from minimind_trl.targets import TargetNotEmptyError
from minimind_trl.tokenization import DEFAULT_TOKENIZER_DIR


def word_level_tokenizer():
    """A 6400-id tokenizer made in memory ("t0" .. "t6399"), standing in for the real one."""
    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(6400)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="t0", bos_token="t1", eos_token="t2")


# ------------------------------------------------------------------------------ native .pth


@pytest.mark.parametrize("name", ["tiny_dense", "tiny_moe", "tiny_dense_yarn"])
def test_native_roundtrip_is_bit_identical(name, reference_dir, tmp_path):
    spec = json.loads((reference_dir / "models.json").read_text())[name]
    source = reference_dir / spec["state_dict_file"]
    model = load_native_checkpoint(source, MiniMindConfig(**spec["config_kwargs"]))
    written = save_native_checkpoint(model, tmp_path / "out.pth")
    original = torch.load(source, weights_only=True)
    again = torch.load(written, weights_only=True)
    assert list(again) == list(original)
    for key, tensor in original.items():
        assert again[key].dtype == torch.float16 and torch.equal(again[key], tensor), key
    assert [p.name for p in tmp_path.iterdir()] == ["out.pth"]  # no temp file left behind


def test_native_save_load_without_reference(tmp_path, make_tiny_model):
    model = make_tiny_model(moe=True, num_experts_per_tok=2)
    path = save_native_checkpoint(model, tmp_path / "full_sft_64_moe.pth", dtype=torch.float32)
    state = torch.load(path, weights_only=True)
    assert list(state) == list(native_key_shapes(model.config))
    assert all(tuple(state[k].shape) == s for k, s in native_key_shapes(model.config).items())
    experts = model.model.layers[1].mlp.experts
    torch.testing.assert_close(state["model.layers.1.mlp.experts.2.up_proj.weight"], experts.gate_up_proj[2, 256:])
    torch.testing.assert_close(state["model.layers.1.mlp.experts.2.down_proj.weight"], experts.down_proj[2])
    reloaded = load_native_checkpoint(path, model.config)
    ids = torch.randint(3, 6400, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)


def test_native_mismatches_are_listed_together(tmp_path, make_tiny_model):
    model = make_tiny_model(moe=True)
    state = torch.load(save_native_checkpoint(model, tmp_path / "a.pth"), weights_only=True)
    del state["model.layers.0.mlp.experts.3.up_proj.weight"]
    state["model.layers.0.mlp.shared_expert.weight"] = torch.zeros(2)
    state["model.norm.weight"] = torch.zeros(65, dtype=torch.float16)
    torch.save(state, tmp_path / "b.pth")
    with pytest.raises(ValueError) as info:
        load_native_checkpoint(tmp_path / "b.pth", model.config)
    message = str(info.value)
    for fragment in ("missing keys", "experts.3.up_proj", "unexpected keys", "shared_expert",
                     "mis-shaped keys", "model.norm.weight (65,)"):
        assert fragment in message
    with pytest.raises(ValueError, match="mlp.gate_proj.weight"):  # a MoE file under a dense config
        load_native_checkpoint(tmp_path / "a.pth", get_preset("tiny"))


# ---------------------------------------------------------------------------------- Hub export

FRESH_PROCESS_LOADER = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folders, ids_path, out_path = sys.argv[1:-2], sys.argv[-2], sys.argv[-1]
    ids = torch.load(ids_path)
    report, logits = {}, {}
    for folder in folders:
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=folder.endswith("minimind")).eval()
        with torch.no_grad():
            logits[folder] = model(ids).logits
        report[folder] = {
            "class": type(model).__name__,
            "module": type(model).__module__,
            "generation": [model.generation_config.bos_token_id, model.generation_config.eos_token_id,
                           model.generation_config.pad_token_id],
            "tokens": AutoTokenizer.from_pretrained(folder, trust_remote_code=True)("t5 t300 t42")["input_ids"]
            if folder.endswith("tok-minimind") else None,
        }
    report["imported_minimind_trl"] = any(name.startswith("minimind_trl") for name in sys.modules)
    torch.save(logits, out_path)
    print(json.dumps(report))
    """
)


def test_save_for_hub_reloads_in_fresh_process(tmp_path, make_tiny_model):
    models = {
        "dense-yarn": make_tiny_model(inference_rope_scaling=True),
        "moe": make_tiny_model(moe=True, seed=1),
    }
    folders = []
    for name, model in models.items():
        for fmt in ("minimind", "qwen3"):
            tokenizer = word_level_tokenizer() if (name, fmt) == ("moe", "minimind") else None
            label = f"{name}-tok-{fmt}" if tokenizer is not None else f"{name}-{fmt}"
            folders.append(str(save_for_hub(model, tokenizer, tmp_path / "hub" / label, format=fmt)))
    assert sorted(p.name for p in (tmp_path / "hub").iterdir()) == sorted(os.path.basename(f) for f in folders)

    ids = torch.randint(3, 6400, (2, 24), generator=torch.Generator().manual_seed(7))
    torch.save(ids, tmp_path / "ids.pt")
    (tmp_path / "load.py").write_text(FRESH_PROCESS_LOADER)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, str(tmp_path / "load.py"), *folders, str(tmp_path / "ids.pt"), str(tmp_path / "out.pt")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    logits = torch.load(tmp_path / "out.pt")
    assert report["imported_minimind_trl"] is False

    expected_class = {"dense-yarn-minimind": "MiniMindForCausalLM", "dense-yarn-qwen3": "Qwen3ForCausalLM",
                      "moe-tok-minimind": "MiniMindForCausalLM", "moe-qwen3": "Qwen3MoeForCausalLM"}
    for folder in folders:
        label = os.path.basename(folder)
        model = models["moe" if label.startswith("moe") else "dense-yarn"]
        with torch.no_grad():
            torch.testing.assert_close(logits[folder], model(ids).logits, atol=1e-5, rtol=1e-5)
        assert report[folder]["class"] == expected_class[label]
        assert report[folder]["generation"] == [1, 2, 0]
        if label.endswith("minimind"):
            assert report[folder]["module"].startswith("transformers_modules.")
    assert report[folders[2]]["tokens"] == word_level_tokenizer()("t5 t300 t42")["input_ids"] == [5, 300, 42]

    with safe_open(os.path.join(folders[3], "model.safetensors"), "pt") as qwen_moe:
        assert "model.layers.0.mlp.experts.3.down_proj.weight" in qwen_moe.keys()  # Hub's per-expert layout
        assert "lm_head.weight" not in qwen_moe.keys()  # tied
    with safe_open(os.path.join(folders[2], "model.safetensors"), "pt") as minimind_moe:
        assert "model.layers.0.mlp.experts.gate_up_proj" in minimind_moe.keys()
    qwen_config = json.loads(open(os.path.join(folders[1], "config.json")).read())
    assert qwen_config["model_type"] == "qwen3" and qwen_config["rope_parameters"]["rope_type"] == "yarn"
    assert qwen_config["rope_parameters"]["attention_factor"] == 1.0


def test_save_for_hub_replaces_atomically(tmp_path, make_tiny_model):
    model = make_tiny_model()
    target = tmp_path / "export"
    save_for_hub(model, None, target, format="qwen3")
    (target / "notes.txt").write_text("not written by an export")
    with pytest.raises(TargetNotEmptyError, match="not an earlier Hub export"):  # issue 40.1: never deleted
        save_for_hub(model, None, target, format="minimind")
    assert (target / "notes.txt").read_text() == "not written by an export"
    (target / "notes.txt").unlink()
    save_for_hub(model, None, target, format="minimind")  # an earlier export (of either format) is replaced
    assert json.loads((target / "config.json").read_text())["model_type"] == "minimind"
    assert (target / "modeling_minimind.py").exists()

    class BrokenTokenizer:
        def save_pretrained(self, folder):
            raise RuntimeError("disk full")

    before = sorted(p.name for p in target.iterdir())
    with pytest.raises(RuntimeError, match="disk full"):
        save_for_hub(model, BrokenTokenizer(), target, format="qwen3")
    assert sorted(p.name for p in target.iterdir()) == before  # the previous export is untouched
    assert [p.name for p in tmp_path.iterdir()] == ["export"]  # and no temporary folder is left
    with pytest.raises(ValueError, match="format"):
        save_for_hub(model, None, target, format="gguf")


# ---------------------------------------------------------------------------- TRL SFTTrainer


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_trl_sft_trainer_lowers_loss(preset, tmp_path, make_tiny_model):
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": [1, *torch.randint(3, 40, (15,), generator=generator).tolist(), 2]} for _ in range(8)]
    args = SFTConfig(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8, learning_rate=1e-2,
        lr_scheduler_type="constant", report_to="none", use_cpu=True, bf16=False, fp16=False,
        logging_steps=1, save_strategy="no", dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )
    trainer = SFTTrainer(model=make_tiny_model(moe=preset == "tiny-moe"), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=word_level_tokenizer())
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert trainer.state.global_step == 3 and len(logs) == 3
    assert logs[-1]["loss"] < logs[0]["loss"]
    assert ("aux_loss" in logs[0]) == (preset == "tiny-moe")


# ------------------------------------------------------------ Hub-ready: card, old loaders, tokenizer

# What transformers 4.x Qwen3Config / Qwen3MoeConfig take when a key is absent from config.json
# (4.x reads these names; 5.x writes rope_parameters, num_local_experts and dtype instead).
OLD_QWEN3_DEFAULTS = {"rope_theta": 10000.0, "rope_scaling": None, "use_cache": True, "torch_dtype": None}
OLD_QWEN3_MOE_DEFAULTS = {**OLD_QWEN3_DEFAULTS, "num_experts": 128}


@pytest.mark.parametrize("preset,overrides", [("tiny", {"inference_rope_scaling": True}),
                                               ("tiny", {"rope_theta": 5e5}), ("tiny-moe", {})])
def test_qwen3_export_config_reads_right_with_old_loaders(preset, overrides, tmp_path, make_tiny_model):
    model = make_tiny_model(moe=preset == "tiny-moe", **overrides)
    model.config.use_cache = False  # as training with activation checkpointing leaves it
    config = json.loads((save_for_hub(model, None, tmp_path / "q", format="qwen3") / "config.json").read_text())
    old_defaults = OLD_QWEN3_MOE_DEFAULTS if model.config.use_moe else OLD_QWEN3_DEFAULTS
    seen_by_old = {key: config.get(key, default) for key, default in old_defaults.items()}
    rope = dict(model.config.rope_parameters)
    expected = {"rope_theta": rope.pop("rope_theta"), "use_cache": True, "torch_dtype": "float32",
                "rope_scaling": rope if overrides.get("inference_rope_scaling") else None}
    if model.config.use_moe:
        expected["num_experts"] = model.config.num_experts
    assert seen_by_old == expected
    if overrides.get("inference_rope_scaling"):  # what 4.x's YaRN reads, upstream's values
        assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"],
                rope["attention_factor"], rope["beta_fast"], rope["beta_slow"]) == ("yarn", 16.0, 2048, 1.0, 32.0, 1.0)
    assert config["rope_parameters"] == model.config.rope_parameters  # what 5.x reads is unchanged
    assert config.get("num_local_experts") == (model.config.num_experts if model.config.use_moe else None)
    minimind = json.loads((save_for_hub(model, None, tmp_path / "m") / "config.json").read_text())
    assert minimind["use_cache"] is True and minimind["rope_theta"] == expected["rope_theta"]


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


RUN_MANIFEST = {
    "kind": "sft", "command": "minimind-trl train recipes/e0/sft.yaml --output-dir runs/e0_sft",
    "recipe": {"kind": "sft", "seed": 42, "description": "E0: assistant-only SFT", "model": {"preset": "tiny"},
               "sft": {"mode": "sft", "max_length": 1024}, "training": {"learning_rate": 0.0005}},
    "recipe_sha256": "ab" * 32, "training_args": {}, "objective": None,
    "versions": {"torch": "2.13.0", "trl": "1.16.0"}, "git": {"commit": "1234abcd", "dirty": False},
    "data": {"path": "data/sft", "split": "train", "file_sha256": "cd" * 32, "manifest_sha256": "ef" * 32,
             "rows": 800},
    "initial_model": {"path": "runs/e0_sft/initial_model", "num_parameters": 532864}, "seed": 42, "world_size": 1,
}


def test_model_card_from_the_run_manifest_and_arguments(tmp_path, make_tiny_model, tokenizer):
    run_dir = tmp_path / "runs" / "e0_sft"
    run_dir.mkdir(parents=True)
    (run_dir / "manifest.json").write_text(json.dumps(RUN_MANIFEST))
    dense, moe = make_tiny_model(), make_tiny_model(moe=True)
    card = (save_for_hub(dense, tokenizer, run_dir / "final") / "README.md").read_text()  # as runs do
    assert _front_matter(card) == {"license": "apache-2.0", "library_name": "transformers",
                                   "pipeline_tag": "text-generation",
                                   "tags": ["minimind", "minimind-trl", "qwen3", "tool-use"]}
    for fragment in ("| preset | `tiny` |", f"| parameters | {count_parameters(dense):,} |", "ab" * 32, "cd" * 32,
                     "ef" * 32, "E0: assistant-only SFT", "learning_rate: 0.0005", "trust_remote_code=True",
                     "data/sft (split train, 800 rows)", "1234abcd"):
        assert fragment in card, fragment

    qwen = save_for_hub(moe, tokenizer, tmp_path / "export" / "qwen3", format="qwen3",
                        manifest=run_dir, metrics={"task_success": 0.7, "questions": 150},
                        base_model="someone/MiniMind-3-MoE")
    card = (qwen / "README.md").read_text()
    assert _front_matter(card)["base_model"] == "someone/MiniMind-3-MoE"
    assert {"qwen3_moe", "moe"} <= set(_front_matter(card)["tags"])
    for fragment in (f"{count_parameters(moe):,} total, {count_parameters(moe, active=True):,} active",
                     "| task_success | 0.7 |", "| questions | 150 |", "ab" * 32, "## How to load"):
        assert fragment in card, fragment
    assert "trust_remote_code" not in card
    # a sweep's manifest holds absolute paths: the published card shows none of them
    absolute = {**RUN_MANIFEST, "data": {**RUN_MANIFEST["data"], "path": str(tmp_path / "data" / "splits")},
                "initial_model": {"path": str(run_dir / "initial_model"), "num_parameters": 532864},
                "recipe": {**RUN_MANIFEST["recipe"], "model": {"path": str(tmp_path / "runs" / "sft" / "final")}}}
    card = (save_for_hub(dense, tokenizer, tmp_path / "export" / "abs", manifest=absolute) / "README.md").read_text()
    assert str(tmp_path) not in card
    assert "…/data/splits (split train, 800 rows)" in card and "…/sft/final" in card
    bare = (save_for_hub(dense, None, tmp_path / "export" / "bare") / "README.md").read_text()
    assert "## Training" not in bare and "## Evaluation" not in bare and "load_tokenizer()" in bare

    # The card's own loading example runs as written, inside the folder (repo id ".").
    snippets = []
    for folder in (run_dir / "final", qwen):
        text = (folder / "README.md").read_text()
        snippets.append(f"import os\nos.chdir({str(folder)!r})\n" +
                        text.split("```python\n")[-1].split("```")[0] + "print('class', type(model).__name__)")
    (tmp_path / "cards.py").write_text("\n".join(snippets))
    result = subprocess.run([sys.executable, str(tmp_path / "cards.py")], capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [line for line in result.stdout.splitlines() if line.startswith("class ")] == [
        "class MiniMindForCausalLM", "class Qwen3MoeForCausalLM"]


def test_exported_tokenizer_config_has_no_local_leftovers(tmp_path, make_tiny_model, tokenizer):
    source = tmp_path / "somewhere" / "my_tokenizer"
    shutil.copytree(DEFAULT_TOKENIZER_DIR, source)
    copied = AutoTokenizer.from_pretrained(str(source))
    for fmt in ("minimind", "qwen3"):
        folder = save_for_hub(make_tiny_model(), copied, tmp_path / f"out-{fmt}", format=fmt)
        text = (folder / "tokenizer_config.json").read_text()
        config = json.loads(text)
        assert not {"is_local", "local_files_only", "name_or_path", "_name_or_path"} & set(config)
        assert str(tmp_path) not in text and "somewhere" not in text
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # a class 4.x also has
        again = AutoTokenizer.from_pretrained(str(folder))
        sample = "<|im_start|>user\n12 * 7 = 84<tool_call><|im_end|>"
        assert again(sample)["input_ids"] == tokenizer(sample)["input_ids"]
        assert again.chat_template == tokenizer.chat_template


def test_the_cards_load_snippet_runs_in_a_fresh_process_without_prompt_or_warning(tmp_path, make_tiny_model,
                                                                                    tokenizer):
    """The card's "How to load" code, run as a user would (plain transformers, stdin closed): no
    "run the custom code? [y/N]" prompt (AutoTokenizer reads config.json, whose auto_map names the
    remote code) and no "model of type ``" warning; it generates."""
    folder = save_for_hub(make_tiny_model(), tokenizer, tmp_path / "export", format="minimind")
    card = (folder / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    assert snippet.count("trust_remote_code=True") == 2  # the model and the tokenizer
    (tmp_path / "snippet.py").write_text(snippet.replace('"."', json.dumps(str(folder))))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": "", "TRANSFORMERS_VERBOSITY": "warning"}
    result = subprocess.run([sys.executable, str(tmp_path / "snippet.py")], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "custom code" not in result.stderr and "model of type ``" not in result.stderr, result.stderr[-2000:]
