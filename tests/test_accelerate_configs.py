"""Every shipped accelerate config loads, and the DeepSpeed ones build valid DeepSpeed configs."""

import copy
import json
from pathlib import Path

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.utils import DeepSpeedPlugin, DistributedType

CONFIG_DIR = Path(__file__).resolve().parents[1] / "accelerate_configs"
ALL_CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))

EXPECTED = {
    "cpu.yaml": (DistributedType.NO, True, 1),
    "cpu_multi.yaml": (DistributedType.MULTI_GPU, True, 2),
    "single_gpu.yaml": (DistributedType.NO, False, 1),
    "multi_gpu.yaml": (DistributedType.MULTI_GPU, False, 8),
    "deepspeed_zero2.yaml": (DistributedType.DEEPSPEED, False, 8),
    "deepspeed_zero3.yaml": (DistributedType.DEEPSPEED, False, 8),
    "deepspeed_zero3_offload.yaml": (DistributedType.DEEPSPEED, False, 8),
}


def test_every_config_is_known():
    assert sorted(p.name for p in ALL_CONFIGS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: p.name)
def test_config_loads(path):
    config = load_config_from_file(str(path))
    dist, use_cpu, nproc = EXPECTED[path.name]
    assert config.distributed_type == dist
    assert bool(config.use_cpu) is use_cpu
    assert config.num_processes == nproc


def _fill_auto(ds_config: dict, micro_batch: int, grad_accum: int, world_size: int) -> dict:
    """What the HF Trainer does to "auto" values, for a fixed set of training arguments."""
    cfg = copy.deepcopy(ds_config)
    cfg["train_micro_batch_size_per_gpu"] = micro_batch
    cfg["gradient_accumulation_steps"] = grad_accum
    cfg["train_batch_size"] = micro_batch * grad_accum * world_size
    cfg["gradient_clipping"] = 1.0
    cfg["bf16"] = {"enabled": True}
    cfg["fp16"] = {"enabled": False}
    zero = cfg["zero_optimization"]
    hidden = 768
    for key, value in list(zero.items()):
        if value == "auto":
            zero[key] = {
                "reduce_bucket_size": hidden * hidden,
                "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "stage3_param_persistence_threshold": 10 * hidden,
            }[key]
    return cfg


@pytest.mark.parametrize(
    "path", [p for p in ALL_CONFIGS if p.name.startswith("deepspeed")], ids=lambda p: p.name
)
def test_deepspeed_plugin_and_config_validate(path, repo_root, monkeypatch):
    deepspeed = pytest.importorskip("deepspeed")  # optional: its config class only after the skip
    from deepspeed.runtime.config import DeepSpeedConfig

    monkeypatch.chdir(repo_root)  # the YAMLs name their JSON relative to the repository root
    config = load_config_from_file(str(path))
    ds_file = config.deepspeed_config["deepspeed_config_file"]
    assert Path(ds_file).is_file(), ds_file
    plugin = DeepSpeedPlugin(hf_ds_config=ds_file, zero3_init_flag=config.deepspeed_config["zero3_init_flag"])
    stage = plugin.zero_stage
    assert stage == (2 if "zero2" in path.name else 3)
    raw = json.loads(Path(ds_file).read_text())
    filled = _fill_auto(raw, micro_batch=4, grad_accum=2, world_size=1)
    validated = DeepSpeedConfig(filled)  # raises on any invalid or inconsistent field
    assert validated.zero_optimization_stage == stage
    assert validated.train_batch_size == 8
    if "offload" in path.name:
        assert validated.zero_config.offload_optimizer.device == "cpu"
        assert validated.zero_config.offload_param.device == "cpu"
    del deepspeed
