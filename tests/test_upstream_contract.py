"""Contract test: every private (or internal) TRL / transformers / accelerate / peft / deepspeed API we touch.

`CONTRACT` is the one table of touch points; docs/CODEBASE.md ("Upstream contract") shows the same rows.
Recorded against trl 1.16.0 and transformers 5.24.0 (peft 0.21.2, accelerate 1.15.0).

On an upstream upgrade run this file first: each failing case names the upstream name that changed,
what was recorded, what is installed, and which of our files to re-read. When our code is right for
the new version, update the row (signature, evidence) and the doc table together.

Nothing here builds a model or a trainer: signatures come from ``inspect.signature``, "still set by
upstream" from the owning class's source text, so the file runs in a few seconds.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import importlib
import inspect
import re
import types
from pathlib import Path

import pytest
import transformers
import trl
from trl import GRPOTrainer

# Our modules that touch upstream internals. Moving a module only needs this block retargeted: the
# table's "our file" column is derived from these modules.
from minimind_trl.engine import kv_batch
from minimind_trl.envs import environment, protocol
from minimind_trl.modeling import aux_loss, configuration_minimind, modeling_minimind, peft_targets, presets
from minimind_trl.tokenization import builder as tokenizer_builder
from minimind_trl.trainer import (
    checkpoints,
    cli as trainer_cli,
    grpo_trainer,
    head_logprobs,
    moe,
    policy_pass,
    recipe,
    run,
)
from minimind_trl.trainer.kinds import distill as distill_kind

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO_ROOT / "minimind_trl"
DOC = REPO_ROOT / "docs" / "CODEBASE.md"
DOC_SECTION = "## Upstream contract (TRL / transformers private touch points)"

RECORDED_VERSIONS = {"trl": "1.16.0", "transformers": "5.24.0"}
UPSTREAM = ("trl", "transformers", "accelerate", "peft", "deepspeed")

OVERRIDE = "overridden method"
READ = "attribute read"
WRITE = "attribute written"
IMPORT = "private import"
REPLACED = "replaced at run time"
BATCH = "batch key read"  # a key of the batch dict TRL's scoring returns, which our passes consume
KINDS = (OVERRIDE, READ, WRITE, IMPORT, REPLACED, BATCH)


def _ours(module: types.ModuleType) -> str:
    return Path(module.__file__).resolve().relative_to(REPO_ROOT).as_posix()


GRPO = _ours(grpo_trainer)
CHECKPOINTS = _ours(checkpoints)
ENVIRONMENT = _ours(environment)
KV_BATCH = _ours(kv_batch)
PROTOCOL = _ours(protocol)
MODELING = _ours(modeling_minimind)
CONFIGURATION = _ours(configuration_minimind)
AUX_LOSS = _ours(aux_loss)
PEFT_TARGETS = _ours(peft_targets)
PRESETS = _ours(presets)
TOKENIZER_BUILDER = _ours(tokenizer_builder)
POLICY_PASS = _ours(policy_pass)
HEAD_LOGPROBS = _ours(head_logprobs)
MOE = _ours(moe)
DISTILL_KIND = _ours(distill_kind)
RECIPE = _ours(recipe)
RUN = _ours(run)
TRAINER_CLI = _ours(trainer_cli)


@dataclasses.dataclass(frozen=True)
class TouchPoint:
    """One place where our code depends on an upstream internal.

    ``owner``: dotted path of the upstream class or module; ``name``: the attribute on it (may be
    dotted, e.g. ``Class.forward``). ``signature``: ``str(inspect.signature(owner.name))`` as
    installed when recorded, or None when only existence matters. ``set_by``: for attributes that
    the owner's own source does not assign, the upstream function that does. ``evidence``:
    (dotted path, source snippet) pairs: upstream behaviour we rely on beyond the signature.
    """

    owner: str
    name: str
    kind: str
    signature: str | None
    ours: str
    why: str
    set_by: str | None = None
    evidence: tuple[tuple[str, str], ...] = ()

    @property
    def upstream_name(self) -> str:
        return f"{self.owner}.{self.name}"


T = TouchPoint
_QWEN3 = "transformers.models.qwen3.modeling_qwen3"
_QWEN3_MOE = "transformers.models.qwen3_moe.modeling_qwen3_moe"
_GRPO = "trl.GRPOTrainer"
_TRIAL = "'optuna.Trial | dict[str, Any] | None'"

# fmt: off
# Recorded against trl 1.16.0, transformers 5.24.0, peft 0.21.2, accelerate 1.15.0.
CONTRACT: tuple[TouchPoint, ...] = (
    # -- MiniMindGRPOTrainer (GRPOTrainer subclass) -------------------------------------------------
    T(_GRPO, "_calculate_rewards", OVERRIDE, "(self, inputs, prompts, completions, completion_ids_list)", GRPO,
      "rewards read the driver's per-turn messages; keep the gathered [N, F] reward matrix",
      evidence=((f"{_GRPO}._calculate_rewards", "rewards_per_func = gather(rewards_per_func)"),
                (f"{_GRPO}._calculate_rewards", "prompts=prompts, completions=completions"))),
    T(_GRPO, "rollout_func", READ, None, GRPO, "our tool rollout through TRL's public seam",
      evidence=((f"{_GRPO}._generate", "output = self.rollout_func(prompts, self)"),
                (f"{_GRPO}._generate", 'tool_mask = extra_fields.pop("env_mask", None)'),
                (f"{_GRPO}._generate", "if self.tools:"))),
    T(_GRPO, "_generate_and_score_completions", OVERRIDE,
      "(self, inputs: list[dict[str, torch.Tensor | typing.Any]]) -> dict[str, torch.Tensor | typing.Any]", GRPO,
      "our advantages and rollout-wide counts",
      evidence=((f"{_GRPO}._generate_and_score_completions", "self._calculate_rewards("),)),
    T(_GRPO, "_prepare_inputs", OVERRIDE,
      "(self, generation_batch: dict[str, torch.Tensor | typing.Any]) -> dict[str, torch.Tensor | typing.Any]", GRPO,
      "regroup micro-batches by prompt, freeze old log-probs",
      evidence=((f"{_GRPO}._prepare_inputs", "self._buffered_inputs = ["),
                (f"{_GRPO}._prepare_inputs", "self._buffered_inputs[self._step % self.args.steps_per_generation]"))),
    T(_GRPO, "_get_per_token_logps_and_entropies", OVERRIDE,
      "(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, "
      "compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, "
      "spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None, "
      "image_position_ids=None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]", GRPO,
      "TRL's log-prob pass on the prefix-shared pass"),
    T(_GRPO, "_compute_loss", OVERRIDE, "(self, model, inputs)", GRPO,
      "our weighted objective; update 0 writes its log-probs into the buffered micro-batch it is served",
      evidence=((f"{_GRPO}.compute_loss", "self._compute_loss("),
                ("transformers.Trainer.training_step", "inputs = self._prepare_inputs(inputs)"),
                ("transformers.Trainer.training_step", "self.compute_loss(model, inputs"))),
    T(_GRPO, "_get_grad_norm", OVERRIDE, "(self, model, grad_norm=None)", GRPO,
      "close the step; stop before a non-finite optimizer step",
      evidence=(("transformers.Trainer._run_epoch", "grad_norm = self._get_grad_norm(model, grad_norm=grad_norm)"),)),
    T(_GRPO, "log", OVERRIDE, "(self, logs: dict[str, float], start_time: float | None = None) -> None", GRPO,
      "add the step record to the logs"),
    T(_GRPO, "train", OVERRIDE,
      f"(self, resume_from_checkpoint: str | bool | None = None, trial: {_TRIAL} = None, "
      "ignore_keys_for_eval: list[str] | None = None) -> transformers.trainer_utils.TrainOutput", GRPO,
      "close the step recorder"),
    T(_GRPO, "training_step", OVERRIDE, "(self, model, inputs, num_items_in_batch)", GRPO, "time the update"),
    T(_GRPO, "_buffered_inputs", WRITE, None, GRPO, "regroup the rollout's micro-batches"),
    T(_GRPO, "_step", WRITE, None, GRPO, "rewind the micro-step after a failed step",
      evidence=((f"{_GRPO}.training_step", "self._step += 1"),)),
    T(_GRPO, "loss_is_scaled_for_ga", WRITE, None, GRPO, "our loss already carries the accumulation weighting",
      evidence=(("transformers.Trainer.training_step", "if not loss_is_scaled_for_ga:"),)),
    T(_GRPO, "_dist", READ, None, GRPO, "gather sharded parameters for generation"),
    T("trl.distributed.DistributedBackend", "summon_full_params", READ, "(self, module, **kwargs)", GRPO,
      "gather sharded parameters for generation"),
    T(_GRPO, "_tokenizer", READ, None, GRPO, "render prompts and tool turns; pad id; install ParseGuard"),
    T(_GRPO, "chat_template_kwargs", READ, None, GRPO, "the think opener of rows without open_thinking"),
    T(_GRPO, "aux_loss_enabled", READ, None, GRPO, "ask TRL's pass for the MoE aux loss"),
    T(_GRPO, "eos_token_ids", READ, None, GRPO, "end a model turn in the MiniMind engine"),
    T(_GRPO, "generation_config", READ, None, GRPO, "the engine's temperature, top-k, top-p"),
    T(_GRPO, "generation_kwargs", READ, None, GRPO, "unwrap the policy for generation as TRL does"),
    T(_GRPO, "max_completion_length", READ, None, GRPO, "the completion's token budget (TRL's tool-loop rule)"),
    T(_GRPO, "num_generations", READ, None, GRPO, "group size of the advantages"),
    T(_GRPO, "num_generations_eval", READ, None, GRPO, "group size of evaluation rollouts"),
    T(_GRPO, "ref_model", READ, None, GRPO, "prefix-shared pass on the reference model"),
    T(_GRPO, "reward_func_names", READ, None, GRPO, "name the reward columns"),
    T(_GRPO, "reward_weights", READ, None, GRPO, "the weighted reward sum"),
    T(_GRPO, "router_aux_loss_coef", READ, None, GRPO, "weight of the MoE aux loss"),
    T(_GRPO, "temperature", READ, None, GRPO, "logits temperature of the policy passes"),
    T("trl.GRPOConfig", "steps_per_generation", WRITE, None, GRPO,
      "switch off TRL's old-log-prob pass under M minibatches",
      evidence=((f"{_GRPO}._generate_and_score_completions",
                 "generate_every = self.args.steps_per_generation * self.num_iterations"),)),
    *(T(f"{_GRPO}._generate_and_score_completions", key, BATCH, None, GRPO, why,
        evidence=((f"{_GRPO}._generate_and_score_completions", f'"{key}"'),))
      for key, why in (("prompt_ids", "policy passes, prefix layout"), ("prompt_mask", "policy passes"),
                       ("completion_ids", "policy passes, lengths"), ("completion_mask", "action mask"),
                       ("tool_mask", "action mask (0 on tool tokens)"), ("advantages", "replaced by ours"),
                       ("sampling_per_token_logps", "the on-policy check"))),
    T(_GRPO, "num_iterations", WRITE, None, GRPO, "switch off TRL's old-log-prob pass",
      evidence=((f"{_GRPO}._generate_and_score_completions",
                 "generate_every = self.args.steps_per_generation * self.num_iterations"),)),
    T("trl.trainer.utils", "split_tensor_dict", IMPORT,
      "(tensor_dict: dict[str, torch.Tensor | None], num_chunks: int) -> list[dict[str, torch.Tensor | None]]",
      GRPO, "re-split the regrouped rollout"),
    T("trl.models.utils", "disable_gradient_checkpointing", IMPORT,
      "(model: transformers.modeling_utils.PreTrainedModel, gradient_checkpointing_kwargs: dict | None = None)",
      GRPO, "old-log-prob replay without checkpointing"),
    T("trl.models.utils", "unwrap_model_for_generation", IMPORT,
      "(model: 'DistributedDataParallel | DeepSpeedEngine', accelerator: 'Accelerator', "
      "gather_deepspeed3_params: bool = True, generation_kwargs: dict | None = None, "
      "gradient_checkpointing_kwargs: dict | None = None)", GRPO, "the generation model of the MiniMind engine"),
    # -- AtomicCheckpointMixin (mixed into MiniMindGRPOTrainer) ------------------------------------
    T(_GRPO, "_get_train_sampler", OVERRIDE,
      "(self, dataset: datasets.arrow_dataset.Dataset | None = None) -> torch.utils.data.sampler.Sampler",
      CHECKPOINTS, "wrap RepeatSampler to replay epochs on resume",
      evidence=((f"{_GRPO}._get_train_sampler", "RepeatSampler("),)),
    T(_GRPO, "_save_checkpoint", OVERRIDE, "(self, model, trial)", CHECKPOINTS,
      "atomic checkpoint holding the rollout buffer"),
    T(_GRPO, "_load_optimizer_and_scheduler", OVERRIDE, "(self, checkpoint)", CHECKPOINTS,
      "restore the rollout buffer on resume"),
    T(_GRPO, "_buffered_inputs", WRITE, None, CHECKPOINTS, "save and restore the rollout buffer"),
    T(_GRPO, "_step", WRITE, None, CHECKPOINTS, "save and restore the micro-step"),
    T("trl.trainer.utils.RepeatSampler", "shuffle", READ, None, CHECKPOINTS, "re-seed each epoch's permutation",
      evidence=(("trl.trainer.utils.RepeatSampler.__iter__",
                 "torch.randperm(self.num_samples, generator=self.generator)"),
                ("transformers.Trainer._run_epoch", "set_epoch(epoch)"))),
    T("trl.trainer.utils.RepeatSampler", "seed", READ, None, CHECKPOINTS, "re-seed each epoch's permutation"),
    T("trl.trainer.utils.RepeatSampler", "generator", READ, None, CHECKPOINTS, "re-seed each epoch's permutation"),
    T("trl.trainer.utils.RepeatSampler", "num_samples", READ, None, CHECKPOINTS, "re-seed each epoch's permutation"),
    T("transformers.trainer_utils", "rotate_checkpoints", IMPORT,
      "(output_dir: str, save_total_limit: int | None = None, best_model_checkpoint: str | None = None, "
      "use_mtime: bool = False, checkpoint_prefix: str = 'checkpoint') -> None", CHECKPOINTS,
      "rotate after the atomic commit"),
    # -- the tool environment: ParseGuard around the tokenizer's response parser ----------------------
    T("transformers.PreTrainedTokenizerBase", "parse_response", REPLACED,
      "(self, response: 'str | list[int] | list[str] | list[list[int]] | np.ndarray | torch.Tensor', "
      "schema: 'dict | None' = None, *, prefix: 'str | list[int] | list[str] | list[list[int]] | np.ndarray | "
      "torch.Tensor | None' = None, tools: 'list[dict | Callable] | None' = None)", ENVIRONMENT,
      "ParseGuard: any parser failure reads as plain text",
      evidence=(("trl.chat_template_utils.parse_response", "tokenizer.parse_response("),
                ("trl.chat_template_utils.parse_response", "except (ValueError, TypeError):"))),
    T("trl.DistillationTrainer", "_tokenizer", READ, None, DISTILL_KIND, "install ParseGuard for distillation"),
    T("trl.chat_template_utils", "parse_response", IMPORT,
      "(tokenizer: transformers.tokenization_utils_base.PreTrainedTokenizerBase, ids: list[int], "
      "prefix: list[int] | None = None, tools: list[dict | collections.abc.Callable] | None = None) -> dict",
      PROTOCOL, "parse a model turn exactly as TRL does"),
    # -- prefix-shared pass, fused-head aux loss, MoE diagnostics ----------------------------------
    T("transformers.Qwen3ForCausalLM", "forward", REPLACED,
      "(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None, "
      "position_ids: torch.LongTensor | None = None, cache: transformers.cache_utils.Cache | None = None, "
      "inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None, "
      "use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0, "
      "**kwargs: *<class 'transformers.utils.generic.TransformersKwargs'>) "
      "-> transformers.modeling_outputs.CausalLMOutputWithPast", POLICY_PASS,
      "prefix_layout calls run our re-implemented Qwen3 layers",
      evidence=tuple((f"{_QWEN3}.Qwen3Attention.__init__", f"self.{a}") for a in
                     ("q_norm", "k_norm", "head_dim", "scaling", "attention_dropout"))
      + tuple((f"{_QWEN3}.Qwen3DecoderLayer.__init__", f"self.{a}") for a in
              ("input_layernorm", "post_attention_layernorm"))
      + ((f"{_QWEN3_MOE}.Qwen3MoeSparseMoeBlock.__init__", "self.gate = Qwen3MoeTopKRouter(config)"),)),
    T("transformers.PreTrainedConfig", "_attn_implementation", READ, None, POLICY_PASS,
      "eager or SDPA block attention"),
    T("transformers.modeling_layers.GradientCheckpointingLayer", "gradient_checkpointing", READ, None, POLICY_PASS,
      "checkpoint our re-implemented layers"),
    T("transformers.modeling_layers.GradientCheckpointingLayer", "_gradient_checkpointing_func", READ, None,
      POLICY_PASS, "checkpoint our re-implemented layers",
      set_by="transformers.PreTrainedModel._set_gradient_checkpointing"),
    T("trl.kernels", "ChunkedLogProbFunction.forward", IMPORT,
      "(ctx, hidden: 'torch.Tensor', weight: 'torch.Tensor', bias: 'torch.Tensor | None', targets: 'torch.Tensor', "
      "temperature: 'float', chunk_size: 'int', final_logit_softcapping: 'float | None' = None, "
      "logit_scale: 'float' = 1.0, outputs: 'tuple[str, ...]' = ('entropy', 'log_sum_sq_probs', 'mean_logits', "
      "'is_top1')) -> 'tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, "
      "torch.Tensor | None]'", HEAD_LOGPROBS, "TRL's chunked log-prob kernel, called positionally (and its numbers "
      "matched on a CPU)"),
    T("transformers.integrations.sdpa_attention", "sdpa_attention_forward", IMPORT,
      "(module: torch.nn.modules.module.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, "
      "attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, "
      "is_causal: bool | None = None, position_bias: torch.Tensor | None = None, **kwargs) "
      "-> tuple[torch.Tensor, None]", POLICY_PASS, "block attention (SDPA)"),
    T(_QWEN3, "eager_attention_forward", IMPORT,
      "(module: torch.nn.modules.module.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, "
      "attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, "
      "**kwargs: *<class 'transformers.utils.generic.TransformersKwargs'>)", POLICY_PASS, "block attention (eager)"),
    T(_QWEN3, "apply_rotary_pos_emb", IMPORT, "(q, k, cos, sin, unsqueeze_dim=1)", POLICY_PASS,
      "RoPE on packed tokens"),
    T("trl.trainer.utils", "add_fused_lm_head", REPLACED,
      "(model: transformers.modeling_utils.PreTrainedModel, temperature: float = 1.0, "
      "cast_lm_head_to_fp32: bool = False, outputs: tuple[str, ...] = ('log_probs',)) -> None", AUX_LOSS,
      "wrap TRL's fused forward: MiniMind's aux loss",
      evidence=(("trl.trainer.utils.add_fused_lm_head", "fused_lm_head=False"),
                ("trl.trainer.utils.add_fused_lm_head", "backbone_outputs.router_logits"),
                ("trl.trainer.utils.add_fused_lm_head", "router_aux_loss_coef"),
                ("trl.trainer.utils.add_fused_lm_head", "model.forward = types.MethodType(_fused_forward, model)"),
                ("trl.GRPOTrainer.__init__", "add_fused_lm_head("),
                ("trl.SFTTrainer.__init__", "add_fused_lm_head("))),
    T("transformers.PreTrainedModel", "_can_record_outputs", READ, None, MOE, "find the router modules"),
    T("transformers.utils.output_capturing.OutputRecorder", "target_class", READ, None, MOE,
      "find the router modules"),
    T("transformers.utils.output_capturing.OutputRecorder", "index", READ, None, MOE, "where the router logits are"),
    # -- KV cache for the MiniMind rollout engine -----------------------------------------------------
    T("transformers.cache_utils.DynamicLayer", "update", OVERRIDE,
      "(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) "
      "-> tuple[torch.Tensor, torch.Tensor]", KV_BATCH, "write new keys and values in place"),
    T("transformers.cache_utils.DynamicLayer", "lazy_initialization", READ,
      "(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None", KV_BATCH, "called by our update"),
    T("transformers.cache_utils.DynamicLayer", "keys", WRITE, None, KV_BATCH, "properties over growing buffers"),
    T("transformers.cache_utils.DynamicLayer", "values", WRITE, None, KV_BATCH, "properties over growing buffers"),
    T("transformers.cache_utils.DynamicCache", "layers", WRITE, None, KV_BATCH, "swap in GrowingLayer"),
    # -- the MiniMind model (also copied next to Hub weights for trust_remote_code) -------------------
    T("transformers.PreTrainedModel", "_init_weights", OVERRIDE, "(self, module)", MODELING,
      "initialise fused experts and router"),
    T("transformers.PreTrainedModel", "_can_set_experts_implementation", OVERRIDE, "() -> bool", MODELING,
      "allow the experts back-end switch"),
    T("transformers.PreTrainedModel", "_no_split_modules", WRITE, None, MODELING, "keep decoder layers whole"),
    T("transformers.PreTrainedModel", "_supports_flash_attn", WRITE, None, MODELING, "declare attention back-ends"),
    T("transformers.PreTrainedModel", "_supports_sdpa", WRITE, None, MODELING, "declare attention back-ends"),
    T("transformers.PreTrainedModel", "_supports_flex_attn", WRITE, None, MODELING, "declare attention back-ends"),
    T("transformers.PreTrainedModel", "_supports_attention_backend", WRITE, None, MODELING,
      "declare attention back-ends"),
    T("transformers.PreTrainedModel", "_can_record_outputs", WRITE, None, MODELING,
      "capture router logits, hidden states, attentions"),
    T("transformers.PreTrainedModel", "_tied_weights_keys", WRITE, None, MODELING, "tie lm_head to the embedding"),
    T("transformers.PreTrainedModel", "_tp_plan", WRITE, None, MODELING, "tensor-parallel plan of lm_head"),
    T("transformers.PreTrainedModel", "_pp_plan", WRITE, None, MODELING, "pipeline-parallel plan of lm_head"),
    T("transformers.initialization", "normal_", IMPORT,
      "(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, generator: torch._C.Generator | None = None) "
      "-> torch.Tensor", MODELING, "initialise expert and router tensors"),
    T("transformers.masking_utils", "create_causal_mask", IMPORT,
      "(config: transformers.configuration_utils.PreTrainedConfig, inputs_embeds: torch.Tensor, "
      "attention_mask: torch.Tensor | None, cache: transformers.cache_utils.Cache | None, "
      "position_ids: torch.Tensor | None = None, or_mask_function: collections.abc.Callable | None = None, "
      "and_mask_function: collections.abc.Callable | None = None, block_sequence_ids: torch.Tensor | None = None, "
      "layer_idx: int | None = None, allow_is_causal_skip: bool = True) "
      "-> torch.Tensor | torch.nn.attention.flex_attention.BlockMask | None", MODELING, "the backbone's mask"),
    T("transformers.modeling_utils", "slice_logits_to_keep", IMPORT,
      "(hidden_states: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor", MODELING,
      "logits_to_keep"),
    T("transformers.utils", "can_return_tuple", IMPORT, "(func)", MODELING, "return_dict handling"),
    T("transformers.utils.deprecation", "deprecate_kwarg", IMPORT,
      "(old_name: str, version: str, new_name: str | None = None, warn_if_greater_or_equal_version: bool = False, "
      "raise_if_greater_or_equal_version: bool = False, raise_if_both_names: bool = False, "
      "additional_message: str | None = None)", MODELING, "accept past_key_values as cache"),
    T("transformers.utils.generic", "merge_with_config_defaults", IMPORT, "(func)", MODELING,
      "config defaults for output flags"),
    T("transformers.utils.output_capturing", "OutputRecorder", IMPORT,
      "(target_class: 'type[nn.Module]', index: 'int' = 0, layer_name: 'str | None' = None, "
      "class_name: 'str | None' = None, capture_initial_hidden_state: 'bool' = True, "
      "num_hidden_layers_key: 'str' = 'num_hidden_layers') -> None", MODELING, "declare captured outputs"),
    T("transformers.utils.output_capturing", "capture_outputs", IMPORT, "(func=None, *, tie_last_hidden_states=True)",
      MODELING, "capture router logits and hidden states"),
    T(_QWEN3, "Qwen3DecoderLayer", IMPORT,
      "(config: transformers.models.qwen3.configuration_qwen3.Qwen3Config, layer_idx: int)", MODELING,
      "dense decoder layer"),
    T(_QWEN3, "Qwen3RMSNorm", IMPORT, "(hidden_size, eps: float = 1e-06) -> None", MODELING, "final norm"),
    T(_QWEN3, "Qwen3RotaryEmbedding", IMPORT,
      "(config: transformers.models.qwen3.configuration_qwen3.Qwen3Config)", MODELING, "RoPE"),
    T(_QWEN3, "Qwen3Attention", IMPORT, None, MODELING, "attention capture target"),
    T(_QWEN3_MOE, "Qwen3MoeDecoderLayer", IMPORT,
      "(config: transformers.models.qwen3_moe.configuration_qwen3_moe.Qwen3MoeConfig, layer_idx: int)", MODELING,
      "MoE decoder layer"),
    T(_QWEN3_MOE, "Qwen3MoeAttention", IMPORT, None, MODELING, "attention capture target"),
    T(_QWEN3_MOE, "Qwen3MoeTopKRouter", IMPORT, None, MODELING, "router capture target and init"),
    T(_QWEN3_MOE, "Qwen3MoeExperts", IMPORT, None, MODELING, "initialise fused experts"),
    T(_QWEN3_MOE, "Qwen3MoeExperts", IMPORT, None, PRESETS, "count expert parameters"),
    T("transformers.activations", "ACT2FN", IMPORT, None, CONFIGURATION, "check hidden_act"),
    # -- elsewhere -----------------------------------------------------------------------------------
    T("transformers.PreTrainedConfig", "_name_or_path", WRITE, None, RUN,
      "TRL loads the reference model from it",
      evidence=(("trl.trainer.utils.get_config_model_id", '"_name_or_path"'),
                ("trl.GRPOTrainer.__init__", "create_model_from_path(get_config_model_id(self.model.config)"))),
    T("transformers.PreTrainedConfig", "_name_or_path", WRITE, None, TRAINER_CLI,
      "TRL loads the reference model from it"),
    T("peft.utils.constants", "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING", REPLACED, None, PEFT_TARGETS,
      "register default LoRA targets for minimind",
      evidence=(("peft.tuners.lora.model.LoraModel",
                 "target_module_mapping = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"),)),
    T("transformers.integrations.integration_utils", "INTEGRATION_TO_CALLBACK", IMPORT, None, RECIPE,
      "known report_to names"),
    T("transformers.utils.chat_template_utils", "render_jinja_template", IMPORT,
      "(conversations: list[list[dict[str, typing.Any]]], tools: list[dict | collections.abc.Callable] | None = None, "
      "documents: list[dict[str, typing.Any]] | None = None, chat_template: str | None = None, "
      "return_assistant_tokens_mask: bool = False, continue_final_message: bool | str = False, "
      "add_generation_prompt: bool = False, **kwargs) -> str", TOKENIZER_BUILDER,
      "render the template while building the tokenizer"),
)
# fmt: on


# ------------------------------------------------------------------------------------------- checker

def resolve(path: str):
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise  # a real module whose own import failed (missing dependency): report that
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ModuleNotFoundError(path)


@functools.cache
def _source(obj) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _assigns(source: str, name: str) -> bool:
    """Whether upstream source sets ``name``: ``x.name = ...`` (annotated or not) or ``setattr(x, "name", ...)``."""
    escaped = re.escape(name)
    return re.search(rf"\.{escaped}\s*(:[^=\n]+)?=(?!=)|setattr\(\s*\w+,\s*[\"']{escaped}[\"']", source) is not None


_MISSING = object()


def _is_upstream(cls: type) -> bool:
    return cls.__module__.split(".")[0] in UPSTREAM


def _attribute_is_set(entry: TouchPoint, owner) -> bool:
    """A class attribute or property, a dataclass field, or assigned in the source of ``set_by`` (default:
    the owner and its upstream bases)."""
    if entry.set_by is None and inspect.isclass(owner):
        if inspect.getattr_static(owner, entry.name, _MISSING) is not _MISSING:
            return True
        if dataclasses.is_dataclass(owner) and entry.name in {f.name for f in dataclasses.fields(owner)}:
            return True
        return any(_assigns(_source(cls), entry.name) for cls in owner.__mro__ if _is_upstream(cls))
    try:
        return _assigns(_source(resolve(entry.set_by) if entry.set_by else owner), entry.name)
    except (ImportError, AttributeError):
        return False


def _versions() -> str:
    recorded = ", ".join(f"{k} {v}" for k, v in RECORDED_VERSIONS.items())
    return f"recorded with {recorded}; installed trl {trl.__version__}, transformers {transformers.__version__}"


def contract_problems(entries=CONTRACT) -> list[str]:
    """One line per broken touch point: which upstream name changed, expected vs installed, our file."""
    problems = []
    for entry in entries:
        def problem(expected: str, installed: str) -> None:
            problems.append(f"{entry.upstream_name} ({entry.kind}) changed upstream: expected {expected}; "
                            f"installed {installed}; update {entry.ours} ({_versions()})")

        try:
            owner = resolve(entry.owner)
        except (ImportError, AttributeError) as exc:
            problem(f"{entry.owner} to exist", f"nothing there ({type(exc).__name__}: {exc})")
            continue
        if entry.kind == BATCH:  # a dict key: its evidence (the key in the producing source) is the check
            obj = owner
        else:
            obj = owner
            for part in entry.name.split("."):
                obj = getattr(obj, part, _MISSING)
        # An instance attribute is not on the class: the attribute check below looks for it.
        instance_attribute = entry.kind in (READ, WRITE) and entry.signature is None
        if obj is _MISSING and not instance_attribute:
            problem("it to exist", "no such attribute")
            continue
        if entry.signature is not None:
            try:
                installed = str(inspect.signature(obj))
            except (TypeError, ValueError) as exc:
                installed = f"no signature ({exc})"
            if installed != entry.signature:
                problem(f"signature {entry.signature}", f"signature {installed}")
        elif instance_attribute and not _attribute_is_set(entry, owner):
            where = entry.set_by or entry.owner
            problem(f"{where} to set {entry.name}", "no class attribute, field or assignment of it")
        for path, snippet in entry.evidence:
            try:
                text = _source(resolve(path))
            except (ImportError, AttributeError) as exc:
                problem(f"{path} to exist", f"nothing there ({type(exc).__name__})")
                continue
            if snippet not in text:
                problem(f"{path} to contain `{snippet}`", "source without it")
    return problems


# ------------------------------------------------------------------------- our upstream subclasses

_NOT_UPSTREAM_BASES = {"NamedTuple", "Protocol", "TypedDict", "Generic", "Enum", "IntEnum", "ABC"}
_IGNORED_NAMES = {"_abc_impl"}  # ABCMeta bookkeeping, not an override


def _maybe_upstream_base(node: ast.expr) -> bool:
    """A base that may be an upstream class: a plain name that is not a builtin, or ``pkg.Class`` of an
    upstream package (``evaluate.Metric``, ``yaml.SafeLoader`` are not ours to check)."""
    if isinstance(node, ast.Name):
        return not hasattr(builtins, node.id) and node.id not in _NOT_UPSTREAM_BASES
    root = node
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in UPSTREAM


@functools.cache
def our_upstream_subclasses() -> tuple[type, ...]:
    """Every class of minimind_trl with an upstream class in its MRO. Candidate modules are found by
    parsing (cheap); only those are imported."""
    classes = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if not any(isinstance(node, ast.ClassDef) and any(_maybe_upstream_base(b) for b in node.bases)
                   for node in ast.walk(tree)):
            continue
        name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if inspect.isclass(obj) and obj.__module__ == name and any(_is_upstream(c) for c in obj.__mro__):
                classes.append(obj)
    return tuple(classes)


def _our_file(cls: type) -> str:
    return Path(inspect.getsourcefile(cls)).resolve().relative_to(REPO_ROOT).as_posix()


def _is_method(value) -> bool:
    return isinstance(value, (types.FunctionType, classmethod, staticmethod, property))


@functools.cache
def our_overrides() -> dict[tuple[str, str], bool]:
    """(our file, name) -> is a method, for every non-dunder name one of our classes (or a mixin of ours
    in its MRO) defines that an upstream class in the same MRO also defines."""
    found = {}
    for cls in our_upstream_subclasses():
        upstream = [c for c in cls.__mro__ if _is_upstream(c)]
        for ours in cls.__mro__:
            if ours.__module__.split(".")[0] != "minimind_trl":
                continue
            for name, value in vars(ours).items():
                if name.startswith("__") or name in _IGNORED_NAMES:
                    continue
                if any(name in vars(c) for c in upstream):
                    found[(_our_file(ours), name)] = _is_method(value)
    return found


# ----------------------------------------------------------------------------------------------- tests

def _entry_id(entry: TouchPoint) -> str:
    return f"{entry.upstream_name}@{Path(entry.ours).stem}"


def test_table_is_well_formed():
    ids = [(e.owner, e.name, e.ours) for e in CONTRACT]
    assert len(ids) == len(set(ids)), "a touch point is listed twice"
    assert {e.kind for e in CONTRACT} <= set(KINDS)
    assert all(e.signature is not None for e in CONTRACT if e.kind == OVERRIDE), "overrides need a signature"


@pytest.mark.parametrize("entry", CONTRACT, ids=_entry_id)
def test_upstream_touch_point_unchanged(entry: TouchPoint):
    problems = contract_problems([entry])
    assert not problems, "\n".join(problems)


def test_every_upstream_override_is_listed():
    """Adding a private override (or class attribute) of an upstream name without a table row fails here."""
    listed = {(e.ours, e.name) for e in CONTRACT if e.kind in (OVERRIDE, WRITE)}
    missing = [f"{name} in {path} ({'overridden method' if method else 'attribute written'})"
               for (path, name), method in sorted(our_overrides().items())
               if name.startswith("_") and (path, name) not in listed]
    assert not missing, f"private upstream names our classes override, missing from CONTRACT: {missing}"


def test_listed_overrides_are_still_ours():
    """A row for an override our class no longer defines is stale."""
    found = our_overrides()
    stale = [_entry_id(e) for e in CONTRACT if e.kind == OVERRIDE and (e.ours, e.name) not in found]
    stale += [_entry_id(e) for e in CONTRACT
              if e.kind == WRITE and e.name.startswith("_") and (e.ours, e.name) in found and found[(e.ours, e.name)]]
    assert not stale, f"CONTRACT lists overrides that our classes no longer define (or define as methods): {stale}"


def test_listed_files_still_touch_their_names():
    """Each row's file still mentions what the row says it touches (a moved or deleted use shows up here)."""
    stale = [_entry_id(e) for e in CONTRACT
             if e.name.split(".")[0] not in (REPO_ROOT / e.ours).read_text(encoding="utf-8")]
    assert not stale, f"CONTRACT rows whose file no longer mentions the name: {stale}"


def test_our_private_attributes_do_not_shadow_upstream_ones():
    """A private attribute we add to an upstream subclass must not be one upstream sets (or starts setting)."""
    listed = {e.name for e in CONTRACT}
    clashes = []
    for cls in our_upstream_subclasses():
        upstream = [c for c in cls.__mro__ if _is_upstream(c)]
        for ours in cls.__mro__:
            if ours.__module__.split(".")[0] != "minimind_trl":
                continue
            names = set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]+)?=(?!=)", _source(ours)))
            names |= {n for n in vars(ours) if n.startswith("_") and not n.startswith("__")}
            for name in sorted(names - listed - _IGNORED_NAMES):
                owner = next((c for c in upstream if name in vars(c) or _assigns(_source(c), name)), None)
                if owner is not None:
                    clashes.append(f"{ours.__qualname__}.{name} is also {owner.__module__}.{owner.__qualname__}'s")
    assert not clashes, f"private names shared with upstream (rename ours, or list them): {sorted(set(clashes))}"


def _private_reads(tree: ast.AST, receivers: tuple[str, ...]) -> set[str]:
    """``_x`` of every ``self._x`` / ``trainer._x`` (read or written) in ``tree`` (dunders aside)."""
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in receivers
            and node.attr.startswith("_") and not node.attr.startswith("__")}


def unlisted_private_reads() -> list[str]:
    """Private names our code reaches on an upstream object that neither our classes define nor the
    contract lists: ``self._x`` inside our upstream subclasses and their mixins, ``trainer._x`` in
    any module of the package. Each is an upstream internal a TRL upgrade could remove silently."""
    listed = {e.name.split(".")[0] for e in CONTRACT}
    problems = set()
    for cls in our_upstream_subclasses():
        ours = [c for c in cls.__mro__ if c.__module__.split(".")[0] == "minimind_trl"]
        defined = set()
        for own in ours:
            defined |= set(vars(own)) | set(re.findall(r"self\.(_[A-Za-z]\w*)\s*(?::[^=\n]+)?=(?!=)", _source(own)))
        for own in ours:
            for name in _private_reads(ast.parse(inspect.cleandoc("\n" + _source(own))), ("self",)):
                if name not in defined and name not in listed and name not in _IGNORED_NAMES:
                    problems.add(f"{own.__qualname__} ({_our_file(own)}) reads self.{name}")
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for name in _private_reads(ast.parse(path.read_text(encoding="utf-8")), ("trainer",)):
            if name not in listed:
                problems.add(f"{path.relative_to(REPO_ROOT).as_posix()} reads trainer.{name}")
    return sorted(problems)


def test_every_private_upstream_name_we_read_is_listed():
    """Issue 39 item 2: an AST walk of our code; a private name reached on an upstream object must be
    ours or a CONTRACT row, so a TRL upgrade that drops it fails here, not deep inside a trainer test."""
    assert not unlisted_private_reads(), unlisted_private_reads()


def test_the_private_read_check_sees_an_unlisted_name():
    tree = ast.parse("class X:\n    def f(self):\n        return self._ghost + trainer._other + self.public")
    assert _private_reads(tree, ("self", "trainer")) == {"_ghost", "_other"}


def test_checker_reports_a_changed_signature(monkeypatch):
    entry = next(e for e in CONTRACT if e.upstream_name == f"{_GRPO}._compute_loss")
    assert contract_problems([entry]) == []

    def changed(self, model, inputs, num_items_in_batch):
        raise AssertionError("never called")

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", changed)
    problems = contract_problems([entry])
    assert len(problems) == 1 and "\n" not in problems[0]
    message = problems[0]
    assert message.startswith(f"{_GRPO}._compute_loss (overridden method) changed upstream")
    assert f"expected signature {entry.signature}" in message
    assert "installed signature (self, model, inputs, num_items_in_batch)" in message
    assert f"update {GRPO}" in message


def test_checker_reports_a_missing_attribute_and_evidence():
    entry = next(e for e in CONTRACT if e.upstream_name == f"{_GRPO}._buffered_inputs" and e.ours == GRPO)
    gone = dataclasses.replace(entry, name="_buffered_inputs_renamed")
    assert any("_buffered_inputs_renamed" in p and "no class attribute" in p for p in contract_problems([gone]))
    moved = dataclasses.replace(entry, evidence=((f"{_GRPO}._prepare_inputs", "no such line"),))
    assert any("to contain `no such line`" in p for p in contract_problems([moved]))
    renamed = dataclasses.replace(entry, owner="trl.NoSuchTrainer")  # a vanished owner is a line, not a crash
    assert any(p.startswith("trl.NoSuchTrainer._buffered_inputs") for p in contract_problems([renamed]))


def _doc_rows() -> set[tuple[str, str, str]]:
    text = DOC.read_text(encoding="utf-8")
    assert DOC_SECTION in text, f"{DOC.name} lacks the section {DOC_SECTION!r}"
    section = text.split(DOC_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            rows.add((cells[0], cells[1], cells[2]))
    return rows


def test_doc_table_matches_contract():
    table = {(e.upstream_name, e.kind, e.ours) for e in CONTRACT}
    doc = _doc_rows()
    assert doc == table, f"docs/CODEBASE.md only: {sorted(doc - table)}; CONTRACT only: {sorted(table - doc)}"


def test_the_grpo_trainer_overrides_at_most_nine_private_methods_none_on_the_rollout_side():
    """Issue 39: the methods of our GRPO trainer classes (mixins included) whose name starts with one
    underscore and that TRL's GRPOTrainer or transformers' Trainer defines. Generation goes through
    TRL's public ``rollout_func``: nothing of TRL's generation or tool loop is overridden."""
    ours = [c for c in grpo_trainer.MiniMindToolGRPOTrainer.__mro__ if c.__module__.startswith("minimind_trl.")]
    upstream = (GRPOTrainer, transformers.Trainer)
    private = sorted({name for c in ours for name, value in vars(c).items()
                      if name.startswith("_") and not name.startswith("__") and _is_method(value)
                      and any(name in vars(u) for u in upstream)})
    assert private == ["_calculate_rewards", "_compute_loss", "_generate_and_score_completions", "_get_grad_norm",
                       "_get_per_token_logps_and_entropies", "_get_train_sampler", "_load_optimizer_and_scheduler",
                       "_prepare_inputs", "_save_checkpoint"]
    rollout_side = {"_generate", "_generate_single_turn", "_tokenize_prompts", "_tool_call_loop",
                    "_get_tool_suffix_ids"}
    assert not rollout_side & {name for c in ours for name in vars(c)}
