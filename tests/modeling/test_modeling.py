"""MiniMind config and model: upstream golden data, cache/attention/padding equivalences, MoE aux loss."""

import json
import math

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from minimind_trl.modeling import (
    PRESETS,
    MiniMindConfig,
    MiniMindForCausalLM,
    count_parameters,
    get_preset,
    load_native_checkpoint,
    router_aux_loss,
)

REFERENCE_MODELS = ["tiny_dense", "tiny_moe", "tiny_dense_yarn"]


def random_ids(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 6400, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- config


def test_config_defaults_are_upstream():
    config = MiniMindConfig()
    expected = dict(
        hidden_size=768, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=96,
        intermediate_size=2432, vocab_size=6400, max_position_embeddings=32768, rope_theta=1e6,
        rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, dropout=0.0, use_moe=False, num_experts=4, num_experts_per_tok=1,
        moe_intermediate_size=2432, norm_topk_prob=True, router_aux_loss_coef=5e-4, inference_rope_scaling=False,
    )
    assert {key: getattr(config, key) for key in expected} == expected
    assert config.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    assert config.model_type == "minimind"


def test_config_derives_sizes_from_hidden():
    config = MiniMindConfig(hidden_size=64, num_attention_heads=4)
    assert (config.head_dim, config.intermediate_size, config.moe_intermediate_size) == (16, 256, 256)
    # An explicit head_dim lifts the divisibility requirement; explicit widths are kept.
    config = MiniMindConfig(hidden_size=100, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                            intermediate_size=300, moe_intermediate_size=128)
    assert (config.head_dim, config.intermediate_size, config.moe_intermediate_size) == (32, 300, 128)


@pytest.mark.parametrize(
    "kwargs, fields",
    [
        (dict(hidden_size=100, num_attention_heads=8), ["hidden_size", "num_attention_heads"]),
        (dict(num_key_value_heads=3), ["num_key_value_heads", "num_attention_heads"]),
        (dict(num_experts=2, num_experts_per_tok=3), ["num_experts_per_tok", "num_experts"]),
        (dict(hidden_size=0, vocab_size=-5, num_hidden_layers=0), ["hidden_size", "vocab_size", "num_hidden_layers"]),
        (dict(intermediate_size=0, moe_intermediate_size=-1), ["intermediate_size", "moe_intermediate_size"]),
        (dict(rope_theta=0.0, rms_norm_eps=-1.0), ["rope_theta", "rms_norm_eps"]),
        (dict(dropout=1.5), ["dropout"]),
        (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), ["rope_parameters", "inference_rope_scaling"]),
    ],
)
def test_invalid_config_names_fields(kwargs, fields):
    with pytest.raises(ValueError) as info:
        MiniMindConfig(**kwargs)
    for field in fields:
        assert field in str(info.value)


def test_config_json_roundtrip_and_router_flag(tmp_path):
    moe = MiniMindConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, use_moe=True,
                         inference_rope_scaling=True, output_router_logits=True)
    moe.save_pretrained(tmp_path)
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(reloaded, MiniMindConfig)
    assert reloaded.to_diff_dict() == moe.to_diff_dict()
    assert reloaded.output_router_logits is True
    assert "_router_logits_flag" not in json.loads((tmp_path / "config.json").read_text())

    dense = MiniMindConfig()
    assert not hasattr(dense, "output_router_logits")  # TRL reads its presence as "MoE"
    dense.output_router_logits = False  # what TRL does to non-MoE configs: harmless
    assert not hasattr(dense, "output_router_logits")
    with pytest.raises(ValueError, match="use_moe"):
        dense.output_router_logits = True


def upstream_yarn_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """DESIGN.md's formula, written out independently of transformers."""
    factor, original, beta_fast, beta_slow = 16.0, 2048, 32.0, 1.0
    index = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = theta ** (-2.0 * index / head_dim)

    def dimension(beta):
        return head_dim * math.log(original / (2 * math.pi * beta)) / (2 * math.log(theta))

    low, high = max(math.floor(dimension(beta_fast)), 0), math.ceil(dimension(beta_slow))
    ramp = ((index - low) / max(high - low, 1e-3)).clamp(0, 1)
    return freq * (1 - ramp + ramp / factor)


@pytest.mark.parametrize("hidden, heads, kv", [(768, 8, 4), (64, 4, 2), (256, 8, 4)])
def test_yarn_frequencies_follow_upstream_formula(hidden, heads, kv):
    config = MiniMindConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                            num_hidden_layers=1, inference_rope_scaling=True)
    rotary = Qwen3RotaryEmbedding(config)
    expected = upstream_yarn_inv_freq(config.head_dim, config.rope_theta)
    torch.testing.assert_close(rotary.inv_freq.double(), expected, rtol=1e-6, atol=0)
    assert rotary.attention_scaling == 1.0
    plain = Qwen3RotaryEmbedding(MiniMindConfig(hidden_size=hidden, num_attention_heads=heads,
                                                num_key_value_heads=kv, num_hidden_layers=1))
    assert not torch.allclose(plain.inv_freq, rotary.inv_freq)


# ------------------------------------------------------------------------ upstream golden data


@pytest.fixture(scope="module")
def reference_models(reference_dir):
    return json.loads((reference_dir / "models.json").read_text())


@pytest.mark.parametrize("name", REFERENCE_MODELS)
def test_native_checkpoint_reproduces_upstream(name, reference_dir, reference_models):
    spec = reference_models[name]
    config = MiniMindConfig(**spec["config_kwargs"])
    model = load_native_checkpoint(reference_dir / spec["state_dict_file"], config)
    expected = torch.load(reference_dir / spec["expected_file"], weights_only=True)
    assert count_parameters(model) == spec["n_params_unique"]

    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
    torch.testing.assert_close(logits, expected["logits"], atol=1e-4, rtol=0)

    model.train()
    with torch.no_grad():
        out = model(expected["input_ids"])
    model.eval()
    upstream_aux = float(expected["aux_loss_train"])
    ours = 0.0 if out.aux_loss is None else float(config.router_aux_loss_coef * out.aux_loss)
    assert (out.aux_loss is None) == (not config.use_moe)
    assert abs(ours - upstream_aux) <= 1e-5 and abs(ours - upstream_aux) <= 1e-4 * abs(upstream_aux) + 1e-9

    generated = model.generate(expected["prompt_ids"], do_sample=False, max_new_tokens=12, eos_token_id=None)
    assert torch.equal(generated, expected["greedy_ids"])


# ------------------------------------------------------------------ equivalences of code paths


@pytest.mark.parametrize("moe", [False, True])
def test_kv_cache_decoding_equals_full_forward(moe, make_tiny_model):
    model = make_tiny_model(moe, inference_rope_scaling=moe)
    ids = random_ids(2, 12)
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :5], use_cache=True)
        steps = [out.logits]
        cache = out.cache
        for t in range(5, 12):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_sdpa_equals_eager(moe, make_tiny_model):
    sdpa = make_tiny_model(moe)
    eager = make_tiny_model(moe, attn_implementation="eager")
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    ids = random_ids(2, 16)
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids, attention_mask=mask).logits[0], eager(ids, attention_mask=mask).logits[0],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sdpa(ids, attention_mask=mask).logits[1, :11],
                                   eager(ids, attention_mask=mask).logits[1, :11], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_right_padding_keeps_real_token_logits(moe, make_tiny_model):
    model = make_tiny_model(moe)
    short, long = random_ids(1, 7, seed=2), random_ids(1, 13, seed=3)
    batch = torch.zeros(2, 13, dtype=torch.long)
    batch[0, :7], batch[1] = short[0], long[0]
    mask = torch.zeros_like(batch)
    mask[0, :7], mask[1] = 1, 1
    with torch.no_grad():
        padded = model(batch, attention_mask=mask).logits
        torch.testing.assert_close(padded[0, :7], model(short).logits[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(padded[1], model(long).logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("moe", [False, True])
def test_left_padded_generate_matches_single_prompts(moe, make_tiny_model):
    model = make_tiny_model(moe)
    prompts = [random_ids(1, 4, seed=4)[0], random_ids(1, 9, seed=5)[0]]
    batch = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros_like(batch)
    for row, prompt in enumerate(prompts):
        batch[row, 9 - len(prompt):] = prompt
        mask[row, 9 - len(prompt):] = 1
    together = model.generate(batch, attention_mask=mask, do_sample=False, max_new_tokens=6, eos_token_id=None)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt[None], do_sample=False, max_new_tokens=6, eos_token_id=None)
        assert torch.equal(together[row, 9:], alone[0, len(prompt):])


@pytest.mark.parametrize("moe", [False, True])
def test_gradient_checkpointing_gives_same_gradients(moe, make_tiny_model):
    ids = random_ids(2, 10)
    grads = []
    for checkpointing in (False, True):
        model = make_tiny_model(moe).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.is_activation_checkpointing and model.model.layers[0].gradient_checkpointing
        model(ids, labels=ids).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)
    if moe:  # top-1 renormalised weights are exactly 1, so the router learns only from the aux loss
        assert grads[1]["model.layers.0.mlp.gate.weight"].abs().sum() > 0


def test_dropout_acts_on_attention_probabilities(make_tiny_model):
    model = make_tiny_model(dropout=0.3, attn_implementation="eager")
    assert model.config.attention_dropout == 0.3
    ids = random_ids(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, model(ids).logits)  # eval: deterministic
        model.train()
        first, second = model(ids).logits, model(ids).logits
    assert not torch.allclose(first, second)


# ------------------------------------------------------------------------------- MoE routing


def aux_by_loops(router_logits, num_experts, top_k, token_mask):
    """Upstream aux loss (unweighted), token by token, over the tokens where token_mask is True."""
    total = 0.0
    tokens = [t for t in range(len(token_mask)) if token_mask[t]]
    for logits in router_logits:
        probs = torch.softmax(logits.double(), dim=-1)
        for expert in range(num_experts):
            assigned = sum(int(expert in probs[t].topk(top_k).indices.tolist()) for t in tokens)
            mean_prob = sum(float(probs[t, expert]) for t in tokens) / len(tokens)
            total += num_experts * (assigned / len(tokens)) * mean_prob
    return total


def test_router_logits_shapes_and_aux_loss(make_tiny_model):
    model = make_tiny_model(moe=True, num_experts=4, num_experts_per_tok=2, seed=3)
    ids = random_ids(2, 6)
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    assert len(out.router_logits) == 2
    assert all(tuple(layer.shape) == (12, 4) for layer in out.router_logits)
    expected = aux_by_loops(out.router_logits, 4, 2, [True] * 12)
    assert out.aux_loss.item() == pytest.approx(expected, rel=1e-5)
    # The routed experts are the top-k of these logits: k assignments per token, load sums to k.
    chosen = out.router_logits[0].softmax(-1).topk(2).indices
    assert chosen.shape == (12, 2) and chosen.unique(dim=1).shape == (12, 2)

    mask = torch.ones_like(ids)
    mask[0, 4:] = 0
    with torch.no_grad():
        masked = model(ids, attention_mask=mask, output_router_logits=True)
    valid = mask.reshape(-1).bool().tolist()
    assert masked.aux_loss.item() == pytest.approx(aux_by_loops(masked.router_logits, 4, 2, valid), rel=1e-5)
    with torch.no_grad():
        ones = model(ids, attention_mask=torch.ones_like(ids), output_router_logits=True)
    torch.testing.assert_close(ones.aux_loss, out.aux_loss)  # an all-ones mask is upstream's (maskless) value


def test_aux_loss_joins_loss_in_training_only(make_tiny_model):
    model = make_tiny_model(moe=True)
    ids = random_ids(2, 8)
    cross_entropy = torch.nn.functional.cross_entropy
    with torch.no_grad():
        evaluated = model(ids, labels=ids)
        expected_ce = cross_entropy(evaluated.logits[:, :-1].reshape(-1, 6400), ids[:, 1:].reshape(-1))
        assert evaluated.aux_loss is None and evaluated.router_logits is None
        torch.testing.assert_close(evaluated.loss, expected_ce)
        model.train()
        trained = model(ids, labels=ids)
    torch.testing.assert_close(trained.loss, expected_ce + 5e-4 * trained.aux_loss)
    assert trained.router_logits is None  # computed for the aux loss, returned only on request
    with pytest.raises(ValueError, match="router_logits"):
        router_aux_loss((), 4, 1)


def test_dense_model_has_no_router_outputs(make_tiny_model):
    model = make_tiny_model().train()
    out = model(random_ids(1, 5), output_router_logits=True)
    assert out.aux_loss is None and out.router_logits is None


@pytest.mark.parametrize("moe", [False, True])
def test_hidden_states_and_attentions_outputs(moe, make_tiny_model):
    model = make_tiny_model(moe, attn_implementation="eager")
    ids = random_ids(2, 7)
    with torch.no_grad():
        out = model(ids, output_hidden_states=True, output_attentions=True)
        embedded = model.model.embed_tokens(ids)
    assert len(out.hidden_states) == 3 and all(h.shape == (2, 7, 64) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[0], embedded)
    torch.testing.assert_close(model.lm_head(out.hidden_states[-1]), out.logits)  # last one is post-norm
    assert len(out.attentions) == 2 and all(a.shape == (2, 4, 7, 7) for a in out.attentions)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(2, 4, 7))
    assert out.attentions[0][0, 0].triu(1).abs().max() == 0  # causal


# ------------------------------------------------------------------- presets and registration


def test_preset_parameter_counts_on_meta_device():
    demo_layer = 2 * 256 * 256 + 2 * 256 * 128 + 2 * 32 + 3 * 256 * 832 + 2 * 256  # q,o + k,v + qk-norm + MLP + norms
    tiny_unused_experts = 2 * (4 - 1) * 3 * 64 * 256  # layers x (E - k) x three [256, 64] matrices
    expected = {
        "minimind-3": (63_912_192, 63_912_192),
        "minimind-3-moe": (198_416_640, 63_936_768),
        "tiny": (532_864, 532_864),
        "tiny-moe": (828_288, 828_288 - tiny_unused_experts),
        "demo": (6400 * 256 + 256 + 4 * demo_layer,) * 2,
    }
    for name, (total, active) in expected.items():
        with torch.device("meta"):
            model = MiniMindForCausalLM(get_preset(name))
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert (count_parameters(model), count_parameters(model, active=True)) == (total, active), name
    assert 4_000_000 < expected["demo"][0] < 5_000_000
    assert get_preset("tiny", num_hidden_layers=3).num_hidden_layers == 3
    with pytest.raises(ValueError, match="unknown name"):
        get_preset("huge")
    with pytest.raises(ValueError, match="hiden_size"):
        get_preset("tiny", hiden_size=32)


def test_auto_classes_and_save_pretrained_roundtrip(tmp_path, make_tiny_model):
    config = AutoConfig.for_model("minimind", **PRESETS["tiny-moe"])
    assert isinstance(config, MiniMindConfig) and config.to_diff_dict() == get_preset("tiny-moe").to_diff_dict()
    model = make_tiny_model(moe=True)
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(reloaded, MiniMindForCausalLM)
    assert reloaded.generation_config.eos_token_id == 2 and reloaded.generation_config.pad_token_id == 0
    ids = random_ids(1, 9)
    with torch.no_grad():
        assert torch.equal(reloaded(ids).logits, model(ids).logits)
