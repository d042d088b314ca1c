"""`minimind-trl export --format gguf`: the file read back with gguf.GGUFReader (tensors, metadata,
vocabulary), and the declared llama.cpp pre-tokenizer giving our ids."""

import json
import re
import shlex
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers import AutoModelForCausalLM

from minimind_trl.cli import main as cli_main
from minimind_trl.conversation import normalize_conversation
from minimind_trl.data.generator import generate_tasks
from minimind_trl.modeling import MiniMindForCausalLM, save_for_hub
from minimind_trl.modeling.gguf_export import gguf_pre_tokenizer, save_gguf
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.tokenization.template import CHAT_TEMPLATE

# llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) for the names we may declare
LLAMA_CPP_REGEX = {
    "qwen2": r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
}


def field(reader, key):
    """A GGUF metadata value as Python (scalars, strings, lists)."""
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def expected_tensors(model) -> dict[str, torch.Tensor]:
    """GGUF name -> weight, taken straight from our state dict (independent of the exporter)."""
    config, sd = model.config, model.state_dict()
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        out |= {f"blk.{i}.attn_norm.weight": sd[p + "input_layernorm.weight"],
                f"blk.{i}.ffn_norm.weight": sd[p + "post_attention_layernorm.weight"],
                f"blk.{i}.attn_q.weight": sd[p + "self_attn.q_proj.weight"],
                f"blk.{i}.attn_k.weight": sd[p + "self_attn.k_proj.weight"],
                f"blk.{i}.attn_v.weight": sd[p + "self_attn.v_proj.weight"],
                f"blk.{i}.attn_output.weight": sd[p + "self_attn.o_proj.weight"],
                f"blk.{i}.attn_q_norm.weight": sd[p + "self_attn.q_norm.weight"],
                f"blk.{i}.attn_k_norm.weight": sd[p + "self_attn.k_norm.weight"]}
        if config.use_moe:
            width = config.moe_intermediate_size
            gate_up = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2I, H] = cat(gate, up) per expert
            out |= {f"blk.{i}.ffn_gate_inp.weight": sd[p + "mlp.gate.weight"],
                    f"blk.{i}.ffn_gate_exps.weight": gate_up[:, :width],
                    f"blk.{i}.ffn_up_exps.weight": gate_up[:, width:],
                    f"blk.{i}.ffn_down_exps.weight": sd[p + "mlp.experts.down_proj"]}
        else:
            out |= {f"blk.{i}.ffn_{n}.weight": sd[p + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down")}
    if not config.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    return out


@pytest.fixture
def make_run(tmp_path, make_tiny_model, tokenizer):
    """make_run(moe=False, **config_overrides) -> (run folder with final/, its tiny model, distinct norms)."""

    def write(moe: bool = False, **overrides) -> tuple[Path, MiniMindForCausalLM]:
        model = make_tiny_model(moe, **overrides)
        with torch.no_grad():  # norms are initialised to ones: make them distinct values
            for name, param in model.named_parameters():
                if param.ndim == 1:
                    param.copy_(torch.rand_like(param) + 0.5)
        run = tmp_path / "runs" / "e0_sft"
        save_for_hub(model, tokenizer, run / "final")
        return run, model

    return write


@pytest.mark.parametrize("preset,outtype", [("tiny", "f16"), ("tiny-moe", "f32"), ("tiny-moe", "bf16")])
def test_gguf_tensors_and_metadata(tmp_path, make_run, preset, outtype):
    run, model = make_run(preset == "tiny-moe")
    out = tmp_path / "export" / "minimind.gguf"
    assert cli_main(["export", str(run), str(out), "--format", "gguf", "--outtype", outtype]) == 0
    reader = gguf.GGUFReader(out)
    config = model.config
    arch = "qwen3moe" if config.use_moe else "qwen3"

    expected = expected_tensors(model)
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == set(expected) and "output.weight" not in tensors  # tied: no output tensor
    for name, weight in expected.items():
        t = tensors[name]
        assert [int(n) for n in t.shape] == list(weight.shape)[::-1], name  # GGUF: innermost first
        matrix = weight.ndim > 1 and not name.endswith("ffn_gate_inp.weight")
        qtype = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[outtype] if matrix else "F32"
        assert t.tensor_type.name == qtype, name
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(weight.shape)
        want = {"F32": weight, "F16": weight.half().float(), "BF16": weight.bfloat16().float()}[qtype]
        np.testing.assert_array_equal(values, want.numpy(), err_msg=name)

    meta = {
        "general.architecture": arch, "general.name": "MiniMind", "general.license": "apache-2.0",
        "general.file_type": {"f32": 0, "f16": 1, "bf16": 32}[outtype],
        f"{arch}.context_length": config.max_position_embeddings, f"{arch}.embedding_length": 64,
        f"{arch}.block_count": 2, f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.attention.head_count": 4, f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 16, f"{arch}.attention.value_length": 16,
        f"{arch}.rope.dimension_count": 16, f"{arch}.vocab_size": 6400,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    if config.use_moe:
        meta |= {f"{arch}.expert_count": 4, f"{arch}.expert_used_count": 1, f"{arch}.expert_feed_forward_length": 256}
    else:
        assert f"{arch}.expert_count" not in reader.fields
    for key, value in meta.items():
        assert field(reader, key) == value, key
    assert field(reader, f"{arch}.rope.freq_base") == pytest.approx(1e6)
    assert field(reader, f"{arch}.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)


def test_gguf_vocabulary_round_trips(tmp_path, tiny_model, tokenizer):
    out = save_gguf(tiny_model, tokenizer, tmp_path / "m.gguf", "f32")
    reader = gguf.GGUFReader(out)
    tokens, types = field(reader, "tokenizer.ggml.tokens"), field(reader, "tokenizer.ggml.token_type")
    assert tokens == tokenizer.convert_ids_to_tokens(list(range(6400)))
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    specials = {a["id"] for a in data["added_tokens"] if a["special"]}  # <|endoftext|>, <|im_start|>, ..., reserved
    assert {0, 1, 2} <= specials and {i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL} == specials
    user = [tokens[i] for i, t in enumerate(types) if t == gguf.TokenType.USER_DEFINED]
    assert user == ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
    assert types.count(gguf.TokenType.NORMAL) == 6400 - len(specials) - 6
    merges = data["model"]["merges"]
    assert field(reader, "tokenizer.ggml.merges") == [" ".join(m) for m in merges]
    # ids -> GGUF token strings -> bytes gives the text back (byte-level BPE strings by id)
    text = "<|im_start|>user\n计算 12 * 7 = 84, ok?<|im_end|>\n<tool_call>\n{\"a\": 1}\n</tool_call>"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.convert_tokens_to_string([tokens[i] for i in ids]) == text


def corpus(tokenizer) -> list[str]:
    texts = [Path(__file__).resolve().parents[2].joinpath("minimind_trl/tokenization/general_text.txt").read_text()]
    texts += [json.dumps(row, ensure_ascii=False, indent=1) for row in generate_tasks(60, seed=3)]
    for row in generate_tasks(20, seed=4):
        messages, tools = normalize_conversation(row["conversations"][:2])
        texts.append(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
    texts += ["  \n\n  x\t\ty\r\nz", "(hello) 'S 'll I'M", "3.14159 1,000,000 -42 x2y", "a  \n b\n\n\n", "émoji 🙂!!\n"]
    return texts


@pytest.mark.parametrize("pre", ["qwen2", "gpt2"])
def test_declared_pre_tokenizer_gives_our_ids(pre, tokenizer):
    """llama.cpp pre-tokenizes with the declared regex, then applies our BPE merges: same ids."""
    ours = tokenizer.backend_tokenizer
    theirs = Tokenizer.from_str(ours.to_str())
    theirs.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA_CPP_REGEX[pre]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    for text in corpus(tokenizer):
        assert theirs.encode(text).ids == ours.encode(text).ids, text[:200]


def test_pre_tokenizer_choice():
    tokenizer = load_tokenizer()  # its own: the test changes its pre-tokenizer
    assert gguf_pre_tokenizer(tokenizer) == "qwen2"
    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # upstream MiniMind's
    assert gguf_pre_tokenizer(tokenizer) == "gpt2"
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(ValueError, match="pre-tokenizer"):
        gguf_pre_tokenizer(tokenizer)


def test_untied_model_writes_output_tensor(tmp_path, make_tiny_model, tokenizer):
    model = make_tiny_model(tie_word_embeddings=False)
    reader = gguf.GGUFReader(save_gguf(model, tokenizer, tmp_path / "m.gguf", "f32"))
    output = next(t for t in reader.tensors if t.name == "output.weight")
    np.testing.assert_array_equal(output.data, model.lm_head.weight.detach().numpy())


@pytest.mark.parametrize("overrides,message", [
    ({"inference_rope_scaling": True}, "YaRN"),
    ({"use_moe": True, "norm_topk_prob": False}, "norm_topk_prob"),
])
def test_unrepresentable_configs_exit_2(tmp_path, make_run, capsys, overrides, message):
    run, _ = make_run(**overrides)
    out = tmp_path / "m.gguf"
    capsys.readouterr()
    assert cli_main(["export", str(run), str(out), "--format", "gguf"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]  # after transformers' loading bar
    assert last.startswith("minimind-trl export: GGUF export: not representable") and message in last
    assert not out.exists() and not list(tmp_path.glob(".m.gguf.*"))


def test_export_cli_hub_formats(tmp_path, make_run):
    run, model = make_run()
    (run / "manifest.json").write_text(json.dumps({"kind": "sft", "recipe_sha256": "ab" * 32}))
    out = tmp_path / "export" / "qwen3"
    assert cli_main(["export", str(run), str(out), "--format", "qwen3"]) == 0
    assert "ab" * 32 in (out / "README.md").read_text()
    qwen = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[1, 5, 300, 42]])
    with torch.no_grad():
        torch.testing.assert_close(qwen(ids).logits, model(ids).logits)
    assert cli_main(["export", str(tmp_path / "missing"), str(out), "--format", "gguf"]) == 2


def test_readme_gguf_command_runs_as_written(tmp_path, make_run, monkeypatch):
    readme = Path(__file__).resolve().parents[2].joinpath("README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("minimind-trl export ") and "--format gguf" in x)
    run, model = make_run(moe=True)
    monkeypatch.chdir(tmp_path)
    assert cli_main(shlex.split(line)[1:]) == 0
    reader = gguf.GGUFReader(tmp_path / "export" / "minimind.gguf")
    assert field(reader, "general.architecture") == "qwen3moe"
    assert len(reader.tensors) == len(expected_tensors(model))


def render_go_template(template: str, messages: list[dict]) -> str:
    """The README Modelfile's Go-template subset as Ollama runs it: `range .Messages`, `.Role`,
    `.Content`, `if eq .Role "..."`, `end`, and `{{-` trimming the whitespace before it."""
    template = re.sub(r"\s*\{\{-", "{{", template)
    parts = re.split(r"(\{\{.*?\}\})", template)

    def render(i: int, message: dict | None) -> tuple[str, int]:
        out = []
        while i < len(parts):
            part = parts[i]
            action = part[2:-2].strip() if part.startswith("{{") else None
            if action is None:
                out.append(part)
            elif action == "end":
                return "".join(out), i
            elif action == "range .Messages":  # messages is never empty here
                for m in messages:
                    text, stop = render(i + 1, m)
                    out.append(text)
                i = stop
            elif action.startswith("if eq .Role "):
                text, stop = render(i + 1, message)
                out.append(text if message["role"] == json.loads(action.split(" ", 3)[3]) else "")
                i = stop
            else:
                out.append({".Role": message["role"], ".Content": message["content"]}[action])
            i += 1
        return "".join(out), i

    return render(0, None)[0]


def test_readme_ollama_template_renders_our_chat_format(tokenizer):
    readme = Path(__file__).resolve().parents[2].joinpath("README.md").read_text(encoding="utf-8")
    modelfile = readme.split("\nFROM ./minimind.gguf\n", 1)[1].split("\n```", 1)[0]
    template = re.search(r'TEMPLATE """(.*?)"""', modelfile, flags=re.S).group(1)
    assert "PARAMETER stop <|im_end|>" in modelfile
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 12 * 7?"},
                {"role": "assistant", "content": "84"}, {"role": "user", "content": "And 12 * 8?"}]
    for turns in (messages[1:2], messages):
        want = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        assert render_go_template(template, turns) == want
