"""Export a model as a Hugging Face folder, either as MiniMind (custom code) or as plain Qwen3.

`format="minimind"`: `save_pretrained` output (safetensors, fused experts) plus an `auto_map` in
config.json and copies of `configuration_minimind.py` / `modeling_minimind.py`, so a process that
never imported this package loads it with
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`.

`format="qwen3"`: a `qwen3` (dense) or `qwen3_moe` folder that stock transformers loads as
`Qwen3ForCausalLM` / `Qwen3MoeForCausalLM` with identical logits (same RoPE dict, YaRN included).
MoE experts are written per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), the layout of
Qwen3-MoE checkpoints on the Hub. Note that Qwen3-MoE's own load-balancing loss differs from
MiniMind's (see `modeling_minimind`), which matters only when training the exported model.

Both write generation_config.json (bos 1, eos 2, pad 0 by default), a model card README.md
(`card.model_card`: license, preset, parameter counts, the training run from a run manifest,
metrics, how to load) and, when given, the tokenizer. Exported configs say `use_cache: true` (a
training run may have switched it off). The qwen3 configs also carry the keys older transformers
releases read instead of `rope_parameters` / `num_local_experts` / `dtype` (`rope_theta`,
`rope_scaling`, `num_experts`, `torch_dtype`): without them 4.x loads the wrong RoPE base silently.
tokenizer_config.json loses the loading leftovers (`is_local`, `local_files_only`, paths) and names
`PreTrainedTokenizerFast`, the class both 4.x and 5.x know.
Writing is atomic (`minimind_trl.fsio.build_directory`): everything goes to `.staging-NAME` beside
`out_dir`, which then replaces `out_dir` by renames (a kill leaves the old export or the new one).
`out_dir` must be new, empty or an earlier export (`is_hub_export`): anything else is refused.
`write_hub_folder` writes the same files into a folder the caller commits (the run folder's final/).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3MoeConfig

from minimind_trl.fsio import build_directory
from minimind_trl.targets import check_output_folder

from .card import model_card, read_manifest
from .configuration_minimind import MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM
from .native import hf_to_native_state_dict

CODE_FILES = ("configuration_minimind.py", "modeling_minimind.py")
AUTO_MAP = {
    "AutoConfig": "configuration_minimind.MiniMindConfig",
    "AutoModel": "modeling_minimind.MiniMindModel",
    "AutoModelForCausalLM": "modeling_minimind.MiniMindForCausalLM",
}
TOKENIZER_LEFTOVERS = ("is_local", "local_files_only", "name_or_path", "_name_or_path", "cache_dir", "_commit_hash")
EXPORT_FILES = ("README.md", "config.json", "generation_config.json", "model.safetensors.index.json",
                "model*.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "chat_template.jinja", *CODE_FILES)
"""Names (patterns) of the files a Hub export holds (both formats, any transformers release we support)."""
EXPORT_MODEL_TYPES = ("minimind", "qwen3", "qwen3_moe")
EARLIER_EXPORT = "an earlier Hub export (minimind or qwen3 format)"


def is_hub_export(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` is an earlier :func:`save_for_hub` export (either format): a config.json of
    one of :data:`EXPORT_MODEL_TYPES` and nothing but regular files named in :data:`EXPORT_FILES`, so
    replacing it loses nothing an export did not write."""
    folder = Path(folder)
    for entry in folder.iterdir():
        if entry.is_symlink() or not entry.is_file() \
                or not any(fnmatch.fnmatchcase(entry.name, pattern) for pattern in EXPORT_FILES):
            return False
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("model_type") in EXPORT_MODEL_TYPES


def qwen3_config(config: MiniMindConfig, dtype: torch.dtype | None = None) -> Qwen3Config | Qwen3MoeConfig:
    """The `Qwen3Config` (dense) or `Qwen3MoeConfig` (MoE) describing the same network."""
    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        use_cache=config.use_cache,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=dict(config.rope_parameters),
        attention_bias=False,
        attention_dropout=config.dropout,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        dtype=dtype,
    )
    if not config.use_moe:
        return Qwen3Config(**common, architectures=["Qwen3ForCausalLM"])
    return Qwen3MoeConfig(
        **common,
        num_experts=config.num_experts,
        num_experts_per_tok=config.num_experts_per_tok,
        moe_intermediate_size=config.moe_intermediate_size,
        norm_topk_prob=config.norm_topk_prob,
        router_aux_loss_coef=config.router_aux_loss_coef,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        architectures=["Qwen3MoeForCausalLM"],
    )


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def legacy_config_keys(config_dict: dict) -> dict:
    """The keys transformers 4.x Qwen3 / Qwen3-MoE configs read, from a 5.x config dict."""
    rope = dict(config_dict["rope_parameters"])
    keys = {"rope_theta": rope.pop("rope_theta"), "torch_dtype": config_dict.get("dtype")}
    keys["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    if "num_local_experts" in config_dict:
        keys["num_experts"] = config_dict["num_local_experts"]
    return keys


def _write_minimind(model: MiniMindForCausalLM, folder: Path) -> None:
    model.save_pretrained(folder)
    _edit_json(folder / "config.json", lambda config: config.update(auto_map=AUTO_MAP, use_cache=True))
    source_dir = Path(__file__).resolve().parent
    for name in CODE_FILES:
        shutil.copyfile(source_dir / name, folder / name)


def _write_qwen3(model: MiniMindForCausalLM, folder: Path) -> None:
    dtype = next(model.parameters()).dtype
    weights = hf_to_native_state_dict(model.state_dict(), model.config, dtype=None)
    if model.config.tie_word_embeddings:
        del weights["lm_head.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    qwen3_config(model.config, dtype=dtype).save_pretrained(folder)
    _edit_json(folder / "config.json", lambda config: config.update(legacy_config_keys(config), use_cache=True))
    model.generation_config.save_pretrained(folder)


def _clean_tokenizer_config(folder: Path) -> None:
    def clean(config: dict) -> None:
        for key in TOKENIZER_LEFTOVERS:
            config.pop(key, None)
        if config.get("tokenizer_class") == "TokenizersBackend":
            config["tokenizer_class"] = "PreTrainedTokenizerFast"

    if (folder / "tokenizer_config.json").exists():
        _edit_json(folder / "tokenizer_config.json", clean)


def write_hub_folder(
    model: MiniMindForCausalLM,
    tokenizer,
    folder: str | os.PathLike,
    format: str = "minimind",
    *,
    manifest: dict | str | os.PathLike | None = None,
    metrics: dict | None = None,
    base_model: str | None = None,
    repo_id: str | None = None,
    run_manifest: str | os.PathLike | None = None,
) -> Path:
    """The files of :func:`save_for_hub` written into the existing folder ``folder`` (no commit).

    ``run_manifest``: the manifest.json consulted when ``manifest`` is None (used only when it is
    a training run's, i.e. records ``recipe_sha256``)."""
    writers = {"minimind": _write_minimind, "qwen3": _write_qwen3}
    if format not in writers:
        raise ValueError(f"save_for_hub: format must be one of {sorted(writers)} (got {format!r})")
    if not isinstance(model, MiniMindForCausalLM):
        raise ValueError(f"save_for_hub: model must be a MiniMindForCausalLM (got {type(model).__name__})")
    folder = Path(folder)
    manifest = read_manifest(manifest)
    if manifest is None and run_manifest is not None and Path(run_manifest).is_file():
        found = read_manifest(run_manifest)
        manifest = found if isinstance(found, dict) and "recipe_sha256" in found else None
    card = model_card(model, format, manifest=manifest, metrics=metrics, base_model=base_model,
                      repo_id=repo_id or ".", with_tokenizer=tokenizer is not None)
    writers[format](model, folder)
    (folder / "README.md").write_text(card, encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        _clean_tokenizer_config(folder)
    return folder


def save_for_hub(
    model: MiniMindForCausalLM,
    tokenizer,
    out_dir: str | os.PathLike,
    format: str = "minimind",
    *,
    manifest: dict | str | os.PathLike | None = None,
    metrics: dict | None = None,
    base_model: str | None = None,
    repo_id: str | None = None,
) -> Path:
    """Write `model` (and `tokenizer`, unless None) to `out_dir` as `format` "minimind" or "qwen3".

    The model card describes the training run of `manifest` (a dict, a manifest.json path or a run
    folder); when it is None and `out_dir` lies in a run folder (its `final/`), that run's manifest.
    `metrics` (name -> value) go into an evaluation table, `base_model` (a Hub id) into the front
    matter, `repo_id` into the loading example (default ".": run inside the folder). Only a new or
    empty folder or an earlier export (:func:`is_hub_export`) is a target (the rule of
    :mod:`minimind_trl.targets`; else :class:`~minimind_trl.targets.OutputTargetError`). The folder
    is replaced atomically; on an error the previous export is untouched and nothing is left behind.
    """
    out_dir = Path(out_dir)
    if format not in ("minimind", "qwen3"):  # refuse before touching the file system
        raise ValueError(f"save_for_hub: format must be one of ['minimind', 'qwen3'] (got {format!r})")
    check_output_folder(out_dir, reuse=is_hub_export, expect=EARLIER_EXPORT)
    with build_directory(out_dir) as staging:
        write_hub_folder(model, tokenizer, staging, format, manifest=manifest, metrics=metrics, base_model=base_model,
                         repo_id=repo_id, run_manifest=out_dir.parent / "manifest.json")
    return out_dir


__all__ = ["EXPORT_FILES", "is_hub_export", "legacy_config_keys", "qwen3_config", "save_for_hub", "write_hub_folder"]
