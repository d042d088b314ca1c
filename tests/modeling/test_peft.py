"""PEFT LoRA on MiniMind: registered default targets, MoE experts through target_parameters, merging."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from minimind_trl.modeling import (
    LORA_TARGET_MODULES,
    MOE_EXPERT_PARAMETERS,
    MiniMindForCausalLM,
    get_preset,
    lora_targets,
)


def adapted_modules(peft_model) -> set[str]:
    """Names (last component) of the modules that carry a LoRA adapter."""
    return {name.rsplit(".", 1)[-1] for name, module in peft_model.named_modules() if hasattr(module, "lora_A")}


def test_default_lora_config_targets_every_projection(tiny_model):
    peft_model = get_peft_model(tiny_model, LoraConfig(task_type="CAUSAL_LM"))
    assert adapted_modules(peft_model) == set(LORA_TARGET_MODULES)
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)


def test_module_names_alone_miss_the_fused_experts(make_tiny_model):
    """The MoE MLP has no linear projections: gate/up/down names adapt attention only; lora_targets
    adds the fused expert tensors."""
    by_names = get_peft_model(make_tiny_model(moe=True),
                              LoraConfig(task_type="CAUSAL_LM", target_modules=list(LORA_TARGET_MODULES)))
    assert not any(".experts" in name and "lora" in name for name, _ in by_names.named_parameters())
    targets = lora_targets(get_preset("tiny-moe"))
    assert targets["target_parameters"] == list(MOE_EXPERT_PARAMETERS)
    complete = get_peft_model(make_tiny_model(moe=True), LoraConfig(task_type="CAUSAL_LM", **targets))
    assert any(".experts" in name and "lora" in name for name, _ in complete.named_parameters())
    assert lora_targets(get_preset("tiny")) == {"target_modules": list(LORA_TARGET_MODULES), "target_parameters": None}


@pytest.mark.parametrize("preset", ["tiny", "tiny-moe"])
def test_lora_trains_and_merges_into_a_plain_model(preset, make_tiny_model):
    model = make_tiny_model(moe=preset == "tiny-moe")
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    config = LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, **lora_targets(model.config))
    peft_model = get_peft_model(model, config)
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(3, 6400, (4, 16), generator=torch.Generator().manual_seed(0))
    peft_model.train()
    losses = []
    for _ in range(3):
        loss = peft_model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    peft_model.eval()
    with torch.no_grad():
        adapted = peft_model(ids).logits
    merged = peft_model.merge_and_unload()
    assert type(merged) is MiniMindForCausalLM
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted, atol=1e-5, rtol=1e-5)
    after = merged.state_dict()
    assert set(after) == set(before)  # no LoRA or wrapper keys left
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    attention = ("q_proj", "k_proj", "v_proj", "o_proj")
    expected = {f"model.layers.{i}.self_attn.{p}.weight" for i in range(2) for p in attention}
    if model.config.use_moe:
        expected |= {f"model.layers.{i}.mlp.experts.{p}" for i in range(2) for p in ("gate_up_proj", "down_proj")}
    else:
        expected |= {f"model.layers.{i}.mlp.{p}_proj.weight" for i in range(2) for p in ("gate", "up", "down")}
    assert changed == expected  # experts included for MoE; embeddings, norms and router untouched
