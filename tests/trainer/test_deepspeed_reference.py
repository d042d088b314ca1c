"""The reference model under DeepSpeed (issue 25 B): TRL wraps it in a DeepSpeed engine, whose
``config`` is DeepSpeed's dict; the prefix-shared pass must be installed on the module inside, and a
call through the engine must give the log-probs of the plain model. Run in a child process (one
gloo rank), so that no process group leaks into other tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("deepspeed")

CHILD = textwrap.dedent(
    """
    import copy, json, os, sys
    import torch, deepspeed
    from minimind_trl.modeling import MiniMindForCausalLM, get_preset
    from minimind_trl.trainer.policy_pass import build_layout, setup_policy_passes

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    report = {}
    for stage in (0, 3):
        for moe in (False, True):
            plain = MiniMindForCausalLM(get_preset("tiny", use_moe=moe)).eval()
            wrapped = copy.deepcopy(plain)
            config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage}}
            engine, *_ = deepspeed.initialize(model=wrapped, config=config)
            engine.eval()
            setup_policy_passes(plain, True)
            inner = setup_policy_passes(engine, True)
            prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]]); prompt_mask = (prompt != 0).long()
            completion = torch.tensor([[12, 13, 2, 0], [14, 15, 16, 2]]); completion_mask = (completion != 0).long()
            layout = build_layout(prompt, prompt_mask, completion, completion_mask)
            options = dict(temperature=1.0, compute_entropy=True, compute_aux_loss=moe, cast_lm_head_to_fp32=False)
            with torch.no_grad():
                ours, theirs = engine(prefix_layout=layout, **options), plain(prefix_layout=layout, **options)
            report[f"stage{stage}_moe{int(moe)}"] = {
                "inner": type(inner).__name__,
                "max_diff": float((ours.log_probs - theirs.log_probs).abs().max()),
                "aux": None if ours.aux_loss is None else float((ours.aux_loss - theirs.aux_loss).abs()),
            }
    print(json.dumps(report))
    """
)


def test_the_prefix_shared_pass_runs_through_a_deepspeed_engine(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29613", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(report) == {"stage0_moe0", "stage0_moe1", "stage3_moe0", "stage3_moe1"}
    for name, entry in report.items():
        assert entry["inner"] == "MiniMindForCausalLM", name
        assert entry["max_diff"] == 0.0, name  # the same module, the same pass: bit-identical
        if name.endswith("moe1"):
            assert entry["aux"] == 0.0, name
