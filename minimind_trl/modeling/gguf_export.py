"""Export a model and its tokenizer as one GGUF file for llama.cpp / Ollama (`save_gguf`).

MiniMind is numerically Qwen3, so the file declares llama.cpp's `qwen3` architecture (dense) or
`qwen3moe` (MoE) and uses their tensor names. GGUF lists dimensions innermost first, so a torch
weight [out, in] is written as is and reads back in llama.cpp as {in, out}:

    model.embed_tokens.weight                   [V, H]        token_embd.weight
    model.layers.{i}.input_layernorm            [H]           blk.{i}.attn_norm.weight
    model.layers.{i}.self_attn.{q,k,v,o}_proj   [out, in]     blk.{i}.attn_{q,k,v,output}.weight
    model.layers.{i}.self_attn.{q,k}_norm       [head_dim]    blk.{i}.attn_{q,k}_norm.weight
    model.layers.{i}.post_attention_layernorm   [H]           blk.{i}.ffn_norm.weight
    dense  mlp.{gate,up,down}_proj              [out, in]     blk.{i}.ffn_{gate,up,down}.weight
    MoE    mlp.gate (router)                    [E, H]        blk.{i}.ffn_gate_inp.weight (always F32)
           experts' gate / up                   [E, I, H]     blk.{i}.ffn_{gate,up}_exps.weight
           experts' down                        [E, H, I]     blk.{i}.ffn_down_exps.weight
    model.norm                                  [H]           output_norm.weight
    lm_head (untied models only)                [V, H]        output.weight

Tied embeddings get no `output.weight`: llama.cpp then reuses `token_embd`. Q and K are not
permuted (Qwen3 uses rotate-half RoPE, llama.cpp's NEOX mode). 1-D tensors (norms) are always F32;
matrices are F32, F16 (default) or BF16. llama.cpp's qwen3moe always renormalises the top-k router
weights with a softmax gate, so a MoE config with `norm_topk_prob=False` is refused, as is YaRN
(`inference_rope_scaling`: llama.cpp's YaRN attention scaling differs from MiniMind's factor 1.0).

The tokenizer is written as llama.cpp's byte-level BPE (`tokenizer.ggml.model` "gpt2"): the
byte-level token strings by id, the merges, token types (specials CONTROL, added non-special tokens
such as `<tool_call>` USER_DEFINED so llama.cpp matches them in text, ids past the tokenizer UNUSED),
bos/eos/padding ids, no automatic bos/eos, and our chat template. `tokenizer.ggml.pre` names the
pre-tokenizer llama.cpp applies, which must split text into the same ids as ours (`gguf_pre_tokenizer`).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType, TokenType, quants

from minimind_trl.targets import check_output_file

from .configuration_minimind import MiniMindConfig
from .modeling_minimind import MiniMindForCausalLM
from .native import hf_to_native_state_dict

OUTTYPES = ("f32", "f16", "bf16")

# The two tokenizer.json pre-tokenizers MiniMind tokenizers use, and the llama.cpp pre-tokenizer
# that gives the same ids (see gguf_pre_tokenizer).
_OURS = [  # the shipped tokenizer: newlines isolated, single digits, then GPT-2's byte-level regex
    {"type": "Split", "pattern": {"String": "\n"}, "behavior": "Isolated", "invert": False},
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
]
_UPSTREAM = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


GGUF_MAGIC = b"GGUF"


def is_gguf_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a GGUF file (it opens with the format's magic), which an export may replace."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def gguf_architecture(config: MiniMindConfig) -> str:
    return "qwen3moe" if config.use_moe else "qwen3"


def gguf_pre_tokenizer(tokenizer) -> str:
    """llama.cpp's name for a pre-tokenizer that gives the same ids as `tokenizer`'s.

    * ours (newline isolated, single digits, GPT-2 regex) -> "qwen2". Qwen2's regex also splits
      single digits; its other pieces are unions of ours (e.g. "(word", "  \\n"), and since every
      merge of our vocabulary lies inside one of our pieces, BPE on the coarser pieces gives the
      same ids (tested on our corpus in tests/modeling/test_gguf_export.py). llama.cpp has no preset equal
      to ours; GPT-2's would also do, but Qwen2's is the one the Qwen3 family declares.
    * upstream MiniMind's (plain byte-level GPT-2 regex, multi-digit merges) -> "gpt2", exact.
    Anything else raises ValueError: pass `pre=` to `save_gguf` after checking the ids yourself.
    """
    pre = json.loads(tokenizer.backend_tokenizer.to_str())["pre_tokenizer"]
    if pre == _UPSTREAM:
        return "gpt2"
    if pre and pre.get("type") == "Sequence" and pre["pretokenizers"] == _OURS:
        return "qwen2"
    raise ValueError(f"GGUF export: no known llama.cpp pre-tokenizer matches this tokenizer's {pre}; "
                     "give one explicitly (pre=... / --gguf-pre) after checking that it gives the same ids")


def gguf_vocab(tokenizer, vocab_size: int) -> tuple[list[str], list[int], list[str]]:
    """(token strings by id, GGUF token types, merges "a b") for a byte-level BPE tokenizer."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"GGUF export: the tokenizer model must be byte-level BPE (got {model.get('type')})")
    by_id = {i: token for token, i in model["vocab"].items()}
    added = {entry["id"]: entry for entry in data.get("added_tokens", [])}
    by_id.update({i: entry["content"] for i, entry in added.items()})
    if max(by_id) >= vocab_size:
        raise ValueError(f"GGUF export: the tokenizer has id {max(by_id)}, the model only {vocab_size} embeddings")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:  # embedding rows no token uses
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(TokenType.CONTROL if added[i]["special"] else TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, [int(t) for t in types], merges


def gguf_tensors(model: MiniMindForCausalLM) -> dict[str, torch.Tensor]:
    """GGUF tensor name -> float32 tensor in torch order (see the module docstring)."""
    config = model.config
    native = hf_to_native_state_dict(model.state_dict(), config, dtype=torch.float32)
    out = {"token_embd.weight": native["model.embed_tokens.weight"]}
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp"}
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        for ours, theirs in names.items():
            key = prefix + ours + ".weight"
            if key in native:
                out[f"blk.{i}.{theirs}.weight"] = native[key]
        if config.use_moe:
            for proj in ("gate", "up", "down"):  # stack_e(W_e): [E, I, H] (gate, up), [E, H, I] (down)
                experts = [native[prefix + f"mlp.experts.{e}.{proj}_proj.weight"] for e in range(config.num_experts)]
                out[f"blk.{i}.ffn_{proj}_exps.weight"] = torch.stack(experts)
    out["output_norm.weight"] = native["model.norm.weight"]
    if not config.tie_word_embeddings:
        out["output.weight"] = native["lm_head.weight"]
    return out


def _check_supported(config: MiniMindConfig) -> None:
    problems = []
    if config.rope_parameters.get("rope_type", "default") != "default":
        problems.append("YaRN RoPE (inference_rope_scaling=True): llama.cpp's YaRN scales attention "
                        "differently from MiniMind; export with inference_rope_scaling=False")
    if config.hidden_act != "silu":
        problems.append(f"hidden_act {config.hidden_act!r} (llama.cpp's qwen3 uses silu)")
    if config.use_moe and not config.norm_topk_prob:
        problems.append("norm_topk_prob=False (llama.cpp's qwen3moe always renormalises the top-k weights)")
    if problems:
        raise ValueError("GGUF export: not representable in llama.cpp: " + "; ".join(problems))


def _add_tensor(writer, name: str, tensor: torch.Tensor, outtype: str) -> None:
    array = tensor.detach().cpu().float().contiguous().numpy()
    if array.ndim == 1 or name.endswith("ffn_gate_inp.weight") or outtype == "f32":
        writer.add_tensor(name, array)
    elif outtype == "f16":
        writer.add_tensor(name, array.astype(np.float16))
    else:  # bf16: raw uint16 bits, shape given in elements
        writer.add_tensor(name, quants.quantize(array, GGMLQuantizationType.BF16), raw_dtype=GGMLQuantizationType.BF16)


def save_gguf(
    model: MiniMindForCausalLM,
    tokenizer,
    path: str | os.PathLike,
    outtype: str = "f16",
    *,
    pre: str | None = None,
    name: str = "MiniMind",
) -> Path:
    """Write `model` with `tokenizer` (one of ours, carrying our chat template) to the GGUF file `path`.

    `outtype` is the type of the matrices ("f32", "f16", "bf16"); `pre` overrides the declared
    pre-tokenizer (default: `gguf_pre_tokenizer(tokenizer)`). Written to a temporary file beside
    `path`, then renamed; an existing `path` must be a GGUF file (:func:`is_gguf_file`, the rule of
    :mod:`minimind_trl.targets`).
    """
    if not isinstance(model, MiniMindForCausalLM):
        raise ValueError(f"save_gguf: model must be a MiniMindForCausalLM (got {type(model).__name__})")
    if outtype not in OUTTYPES:
        raise ValueError(f"save_gguf: outtype must be one of {OUTTYPES} (got {outtype!r})")
    config = model.config
    _check_supported(config)
    pre = pre or gguf_pre_tokenizer(tokenizer)
    tokens, types, merges = gguf_vocab(tokenizer, config.vocab_size)
    arch = gguf_architecture(config)
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype]

    path = check_output_file(path, reuse=is_gguf_file, expect="a GGUF file")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(temp, arch)  # writes general.architecture
        writer.add_name(name)
        writer.add_license("apache-2.0")
        writer.add_file_type(int(file_type))
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_hidden_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_key_value_heads)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_rope_dimension_count(config.head_dim)  # llama.cpp's qwen3 requires n_rot == head_dim
        writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
        writer.add_vocab_size(config.vocab_size)
        if config.use_moe:
            writer.add_expert_count(config.num_experts)
            writer.add_expert_used_count(config.num_experts_per_tok)
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(config.bos_token_id)
        writer.add_eos_token_id(config.eos_token_id)
        writer.add_pad_token_id(config.pad_token_id)
        writer.add_add_bos_token(False)
        writer.add_add_eos_token(False)
        if getattr(tokenizer, "chat_template", None):
            writer.add_chat_template(tokenizer.chat_template)
        for tensor_name, tensor in gguf_tensors(model).items():
            _add_tensor(writer, tensor_name, tensor, outtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(temp, 0o644 & ~_umask())
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


__all__ = ["OUTTYPES", "gguf_architecture", "gguf_pre_tokenizer", "gguf_tensors", "gguf_vocab", "save_gguf"]
