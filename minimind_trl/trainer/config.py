"""`MiniMindGRPOConfig`: TRL's `GRPOConfig` plus the objective and run-discipline fields.

The objective fields select a :class:`minimind_trl.objectives.ObjectiveConfig`; TRL's own loss
options (`loss_type`, `scale_rewards`, `importance_sampling_level`, ...) are not used by
:class:`~minimind_trl.trainer.grpo_trainer.MiniMindGRPOTrainer` and must stay at their defaults,
so that a recipe can never believe it changed the loss when it did not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl import GRPOConfig

from minimind_trl.objectives import ObjectiveConfig

# TRL options our trainer replaces or does not support: name -> (TRL default, what to use instead).
_TRL_OPTIONS_REPLACED: dict[str, tuple[object, str]] = {
    "loss_type": ("dapo", "`objective` / `policy` / `reduction`"),
    "scale_rewards": ("group", "`advantage` ('zscore' or 'center')"),
    "importance_sampling_level": ("token", "`objective='gspo'` (sequence-level ratio)"),
    "multi_objective_aggregation": ("sum_then_normalize", "weighted reward sum (`reward_weights`)"),
    "top_entropy_quantile": (1.0, "nothing (not supported)"),
    "off_policy_mask_threshold": (None, "nothing (not supported)"),
    "delta": (None, "nothing (not supported)"),
    "entropy_coef": (0.0, "nothing (not supported)"),
    "use_adaptive_entropy": (False, "nothing (not supported)"),
    "use_vllm": (False, "the project's own rollout engine (vLLM is not supported in training: vLLM pins an older "
                        "transformers than the project needs, and the exact old-log-prob replay assumes one engine)"),
}
ROLLOUT_ENGINES = ("minimind", "trl")  # rollout.engine / rollout_engine: our decode loop or TRL's generate
SAMPLING_STREAMS = ("process", "global_row")  # rollout.sampling_streams / sampling_streams
_GENERATION_OPTIONS = frozenset({"use_vllm"})
_TRL_DEFAULT_EPSILON = 0.2


@dataclass
class MiniMindGRPOConfig(GRPOConfig):
    r"""Configuration of :class:`~minimind_trl.trainer.grpo_trainer.MiniMindGRPOTrainer`.

    Everything of [`trl.GRPOConfig`] / [`transformers.TrainingArguments`] applies, plus the fields
    below. The objective fields left at `None` take the value of the `objective` preset
    (:data:`minimind_trl.objectives.PRESETS`); the resolved values are written back, so the saved
    config shows what was actually optimised.

    Parameters:
        > Objective (see `docs/objectives.md`)

        objective (`str`, defaults to `"grpo"`):
            Preset name: `"grpo"` (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300), `"cispo"`
            (MiniMax-M1, arXiv:2506.13585), `"dr_grpo"` (Liu et al. 2025, arXiv:2503.20783) or
            `"gspo"` (Zheng et al. 2025, arXiv:2507.18071).
        policy (`str`, *optional*):
            Policy term: `"clip"`, `"cispo"`, `"gspo"` or a registered plugin objective.
        advantage (`str`, *optional*):
            `"zscore"` (reward minus group mean over unbiased group std + 1e-4, GRPO) or `"center"`
            (reward minus group mean, Dr.GRPO).
        reduction (`str`, *optional*):
            `"seq_mean"` (GRPO), `"fixed_length"` (Dr.GRPO, divides by `fixed_length`),
            `"token_mean"` (DAPO-style) or `"sequence"` (GSPO).
        epsilon_low (`float`, *optional*):
            Lower clip range, ratios below `1 - epsilon_low` are clipped (PPO, Schulman et al. 2017).
            TRL's `epsilon` is the same quantity: it is overwritten with the resolved value; set
            `epsilon_low` rather than `epsilon` (a non-default `epsilon` raises).
        epsilon_high (`float`, *optional*):
            TRL's field, reused: upper clip range (DAPO, Yu et al. 2025). `None` takes the preset's
            value (0.2 for GRPO / Dr.GRPO, 4e-4 for GSPO). Not CISPO's cap: see `cispo_max`.
        cispo_max (`float`, *optional*):
            Absolute cap on CISPO's stop-gradient importance weight (preset: 5.0).
        fixed_length (`int`, *optional*):
            The constant L of the `"fixed_length"` reduction (Dr.GRPO preset: 768).
        beta (`float`, defaults to `0.0`):
            TRL's field, reused: weight of the k3 reference KL, a token mean over all action tokens.
            TRL's `use_bias_correction_kl` does not apply (no importance weight on the KL).

        > Fixed-K replay

        num_iterations (`int`, defaults to `4`):
            E, the number of passes over every rollout (TRL's μ; the "K = 4 passes" of the
            reference lab and of PPO's epochs, Schulman et al. 2017). With `minibatches` = 1
            (the default) each pass is one optimizer step on the whole rollout, so E = K.
        minibatches (`int`, defaults to `1`):
            M, the number of minibatches each pass splits the rollout into, one optimizer step
            each ("K" in the sense of DeepSeek-R1, DAPO and GSPO: a rollout of M x B
            trajectories feeds M updates of B, each trajectory used once per pass; TRL's
            `steps_per_generation` = M x `gradient_accumulation_steps`). A rollout then takes
            K = E x M optimizer steps; update k = e x M + m is pass e, minibatch m. The old
            log-probs are computed once per rollout, before its first update, by the not yet
            updated policy, micro-batch by micro-batch exactly as the updates slice the rollout,
            so update 0's ratio is exactly 1 and every later update (every minibatch after the
            first) is measured against the policy that sampled the rollout. Each optimizer step
            weights its loss by its own minibatch's rows and tokens (a step's objective is the
            mean over its minibatch, whatever M).

        > Policy passes

        prefix_sharing (`bool`, defaults to `True`):
            Run the old-log-prob replay, every update and the reference-model pass through
            :mod:`minimind_trl.trainer.policy_pass`: each micro-batch is packed so that every
            distinct prompt (and the preamble all prompts share) is encoded once and no linear
            layer sees a pad; completions attend to the shared keys and values, and gradients flow
            through them (Prefix Grouper, Liu et al. 2025, arXiv:2506.05433). Per-token log-probs
            and gradients equal the plain pass within float rounding (tested to 1e-5); the MoE aux
            loss and router statistics count a shared token once per row, as the plain pass does.
            With several accumulation steps the rollout's rows are regrouped so that a group's
            trajectories share a micro-batch (the step's gradient does not depend on the split; the
            MoE aux loss, a statistic of each micro-batch, does: it then sees other rows together).
            `False`: TRL's pass, one padded ``[prompt | completion]`` row per trajectory.
        cast_attention_to_fp32 (`bool`, defaults to `False`):
            Under bf16 mixed precision, run the prefix-shared pass's attention (softmax(QK^T/√d + mask)V,
            forward and backward; old log-probs, updates and the reference pass alike) in fp32 on the
            bf16 queries, keys and values, as TRL's `cast_lm_head_to_fp32` does for the LM head. On a
            CPU bf16 attention with a mask is slower than fp32 (`benchmarks/README.md`), so this is
            faster there; it also changes the numbers (more accurate attention), hence an option,
            off by default here and set by the demo's CPU recipes (`recipes/demo/rl.yaml`), whose
            learning-parity table against fp32 is in docs/demo_results.md. The old-log-prob pass and
            every update use the same setting, so update 0's ratio stays exactly 1. No effect in fp32.
            Needs `prefix_sharing` (TRL's pass runs the model's own attention).

        > Rollouts

        rollout_engine (`str`, defaults to `"minimind"`):
            What generates each model turn of a training rollout; the turns, tools and tool turns
            are the rollout driver's either way (`minimind_trl.envs.rollout.drive`, TRL 1.16's tool
            loop rules, through TRL's ``rollout_func``). `"minimind"`:
            :func:`minimind_trl.engine.turns.generate_turns` (continuous batching over one KV
            cache, contexts encoded without repeats, per-row random streams seeded from `seed`,
            the step and the context, so a trajectory does not depend on the batch it shares).
            Supports `temperature`, `top_k` and `top_p` (TRL's warpers, in TRL's order), or greedy
            through `generation_kwargs={"do_sample": False}`. `"trl"`: transformers' padded
            `generate` as TRL calls it (:func:`minimind_trl.engine.turns.padded_generate_turns`),
            the global random stream; the baseline of `benchmarks/rl_step.py`.
        sampling_streams (`str`, defaults to `"process"`):
            How the minimind engine keys each row's random stream. `"process"`: the step, the process
            index and the row's context (with its occurrence among equal contexts of the process),
            so the same seed samples other trajectories on 1 and on 2 processes; the demo's
            published runs used it. `"global_row"`: the step, the row's place in the whole rollout
            (its prompt's index times the group size plus its sample index, over all processes)
            and its context, so one seed gives the same trajectories on 1, 2 or 4 processes
            (issue 25 F). Needs `rollout_engine="minimind"`.

        > Run discipline and diagnostics

        logging_steps (`int`, defaults to `1`):
            Must be 1: `metrics.jsonl` and the reporters get one record per optimizer step.
        metrics_file (`str`, defaults to `"metrics.jsonl"`):
            File name, inside `output_dir`, of the per-step diagnostics (see `docs/recipes.md`).
        moe_diagnostics (`bool`, defaults to `True`):
            For Mixture-of-Experts models, record per-layer expert loads, router entropy, aux loss
            and the routing flip rate between the old-log-prob pass and the update pass.
    """

    objective: str = field(default="grpo", metadata={"help": "Objective preset: grpo, cispo, dr_grpo or gspo."})
    policy: str | None = field(default=None, metadata={"help": "Policy term override (clip, cispo, gspo)."})
    advantage: str | None = field(default=None, metadata={"help": "Advantage override (zscore, center)."})
    reduction: str | None = field(
        default=None, metadata={"help": "Reduction override (seq_mean, fixed_length, token_mean, sequence)."}
    )
    epsilon_low: float | None = field(default=None, metadata={"help": "Lower clip range (overrides the preset)."})
    cispo_max: float | None = field(default=None, metadata={"help": "CISPO importance-weight cap (preset 5.0)."})
    fixed_length: int | None = field(default=None, metadata={"help": "L of the fixed_length reduction."})
    num_iterations: int = field(default=4, metadata={"help": "E: passes over each rollout on frozen old log-probs."})
    minibatches: int = field(default=1, metadata={"help": "M: optimizer steps per pass (each on 1/M of the rollout)."})
    logging_steps: float = field(default=1, metadata={"help": "Must be 1 (one metrics record per optimizer step)."})
    metrics_file: str = field(default="metrics.jsonl", metadata={"help": "Per-step diagnostics file in output_dir."})
    moe_diagnostics: bool = field(default=True, metadata={"help": "Per-layer MoE router diagnostics."})
    rollout_engine: str = field(
        default="minimind",
        metadata={"help": "Turn generation: minimind (continuous batching) or trl (TRL's generate)."},
    )
    sampling_streams: str = field(
        default="process",
        metadata={"help": "Per-row random streams keyed by process (process) or by global row (global_row)."},
    )
    prefix_sharing: bool = field(
        default=True, metadata={"help": "Encode each distinct prompt once per policy pass (exact; False: TRL's pass)."}
    )
    cast_attention_to_fp32: bool = field(
        default=False, metadata={"help": "Attention of the prefix-shared pass in fp32 under bf16 (faster on CPUs)."}
    )

    def __post_init__(self) -> None:
        if self.steps_per_generation is None and self.generation_batch_size is None and type(self.minibatches) is int:
            self.steps_per_generation = self.gradient_accumulation_steps * self.minibatches  # TRL's default x M
        super().__post_init__()
        for name, (default, instead) in _TRL_OPTIONS_REPLACED.items():
            if getattr(self, name) != default:
                what = "generation" if name in _GENERATION_OPTIONS else "loss"
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is a TRL {what} option that MiniMindGRPOTrainer does not use; "
                    f"leave it at {default!r} and use {instead}"
                )
        if self.logging_strategy != "steps" or self.logging_steps != 1:
            raise ValueError(
                "logging_strategy must be 'steps' and logging_steps 1 (one metrics.jsonl record per optimizer "
                f"step), got {self.logging_strategy!r} / {self.logging_steps}"
            )
        if isinstance(self.minibatches, bool) or not isinstance(self.minibatches, int) or self.minibatches < 1:
            raise ValueError(f"minibatches (M) must be an int >= 1, got {self.minibatches!r}")
        if self.steps_per_generation != self.gradient_accumulation_steps * self.minibatches:
            raise ValueError(
                f"steps_per_generation ({self.steps_per_generation}) must equal gradient_accumulation_steps "
                f"({self.gradient_accumulation_steps}) x minibatches ({self.minibatches}): each optimizer step uses "
                "one minibatch, each pass the whole rollout once"
            )
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise ValueError(f"rollout_engine must be one of {ROLLOUT_ENGINES}, got {self.rollout_engine!r}")
        if self.sampling_streams not in SAMPLING_STREAMS:
            raise ValueError(f"sampling_streams must be one of {SAMPLING_STREAMS}, got {self.sampling_streams!r}")
        if self.sampling_streams != "process" and self.rollout_engine != "minimind":
            raise ValueError("sampling_streams 'global_row' keys the minimind engine's streams; rollout_engine "
                             f"{self.rollout_engine!r} samples from TRL's one stream")
        if self.use_transformers_continuous_batching:
            raise ValueError("use_transformers_continuous_batching: training rollouts run the project's driver "
                             "(TRL's rollout_func), not TRL's generation; leave it off")
        if self.rollout_engine == "minimind":
            unsupported = {k: getattr(self, k) for k, default in (("min_p", None), ("repetition_penalty", 1.0))
                           if getattr(self, k) != default}
            unsupported.update({k: v for k, v in (self.generation_kwargs or {}).items() if k != "do_sample"})
            if unsupported:
                raise ValueError(
                    f"rollout_engine 'minimind' samples with temperature / top_k / top_p only, got {unsupported}; "
                    "use rollout.engine: trl for these settings")
        if self.cast_attention_to_fp32 and not self.prefix_sharing:
            raise ValueError("cast_attention_to_fp32 applies to the prefix-shared pass; with prefix_sharing false "
                             "TRL's pass runs the model's own attention: set prefix_sharing true or "
                             "cast_attention_to_fp32 false")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations (K) must be >= 1, got {self.num_iterations}")
        if self.epsilon_low is None and self.epsilon != _TRL_DEFAULT_EPSILON:
            raise ValueError(f"set epsilon_low instead of TRL's epsilon (got epsilon={self.epsilon})")
        resolved = self.objective_config()
        self.epsilon_low = self.epsilon = resolved.epsilon_low
        self.epsilon_high = resolved.epsilon_high
        self.policy, self.advantage, self.reduction = resolved.policy, resolved.advantage, resolved.reduction
        self.cispo_max, self.fixed_length = resolved.cispo_max, resolved.fixed_length

    @property
    def updates_per_rollout(self) -> int:
        """K = E x M: optimizer steps per rollout (``num_iterations`` passes x ``minibatches``)."""
        return self.num_iterations * self.minibatches

    def replay_dict(self) -> dict:
        """The replay as the manifest records it: passes E, minibatches M, K = E x M."""
        return {"passes": self.num_iterations, "minibatches": self.minibatches,
                "updates_per_rollout": self.updates_per_rollout}

    def objective_config(self) -> ObjectiveConfig:
        """The :class:`ObjectiveConfig` these fields select: the preset, then the non-None overrides."""
        overrides = {
            spec.name: getattr(self, spec.name)
            for spec in dataclasses.fields(ObjectiveConfig)
            if spec.name != "beta" and getattr(self, spec.name) is not None  # beta: always set (TRL's field)
        }
        return ObjectiveConfig.preset(self.objective, beta=self.beta, **overrides)

    def objective_dict(self) -> dict:
        """The resolved objective as a plain dict (for manifests)."""
        return {"preset": self.objective, **dataclasses.asdict(self.objective_config())}
