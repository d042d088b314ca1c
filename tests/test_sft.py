"""E0 stage: assistant-only masks by token ids, SFTTrainer labels, training steps, long rows, pretrain."""

from __future__ import annotations

import json

import pytest
import torch
from trl import SFTTrainer

from minimind_trl.data import generate_tasks, gold_trajectory, row_messages
from minimind_trl.modeling import MiniMindForCausalLM
from minimind_trl.tokenization import load_tokenizer
from minimind_trl.trainer import build
from minimind_trl.trainer.recipe import validate_recipe
from minimind_trl.trainer.sft import (
    ASSISTANT_HEADER,
    MiniMindSFTTrainer,
    assistant_token_mask,
    build_sft_dataset,
    tokenize_conversation,
)


def _tool(name, description, **properties):
    parameters = {"type": "object", "properties": properties, "required": list(properties)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = [
    _tool("calculate_math", "Evaluate an expression.", expression={"type": "string"}),
    _tool("unit_converter", "Convert units.", value={"type": "number"}, from_unit={"type": "string"},
          to_unit={"type": "string"}),
]


def _calls(*calls):
    return json.dumps([{"name": name, "arguments": arguments} for name, arguments in calls])


# Upstream schema: tools as a JSON string on the system turn, tool_calls as JSON strings, role "tool".
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant.", "tools": json.dumps(TOOLS)},
    {"role": "user", "content": "What is 12*7, and how many metres are 3 km?"},
    {"role": "assistant", "content": "", "reasoning_content": "Two tools at once.",
     "tool_calls": _calls(("calculate_math", {"expression": "12*7"}),
                          ("unit_converter", {"value": 3, "from_unit": "km", "to_unit": "m"}))},
    {"role": "tool", "content": '{"result": "84"}'},
    {"role": "tool", "content": '{"result": "3000"}'},
    {"role": "assistant", "content": "Now the sum.",
     "tool_calls": _calls(("calculate_math", {"expression": "84+3000"}))},
    {"role": "tool", "content": '{"result": "3084"}'},
    {"role": "assistant", "content": "12*7 = 84, 3 km = 3000 m, together 3084."},
    {"role": "user", "content": "谢谢！再加 1 呢？"},
    {"role": "assistant", "content": "<think>\n3084 + 1\n</think>\n\n3085"},
]
CHAT_CONVERSATION = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": "Hi!"},
    {"role": "user", "content": "Again, in Chinese."},
    {"role": "assistant", "content": "你好！"},
]
BRIEF_CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture
def tok(tokenizer):
    """The shared packaged tokenizer (conftest), under this file's short name."""
    return tokenizer


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def expected_mask(tok, conversations):
    """The assistant mask from token counts of template-rendered prefixes (no id scanning)."""
    messages, tools = row_messages(conversations)
    render = lambda msgs: tok.apply_chat_template(msgs, tools=tools, tokenize=False)  # noqa: E731
    full = _ids(tok, render(messages))
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        opened = _ids(tok, render(messages[:i]) + ASSISTANT_HEADER)
        closed = _ids(tok, render(messages[: i + 1]))
        assert full[: len(closed)] == closed and closed[: len(opened)] == opened  # prefixes tokenize stably
        assert tok.convert_ids_to_tokens(closed[-2:]) == ["<|im_end|>", "Ċ"]
        mask[len(opened) : len(closed) - 1] = [1] * (len(closed) - 1 - len(opened))  # the "\n" stays out
    return full, mask


@pytest.mark.parametrize("conversation", [TOOL_CONVERSATION, CHAT_CONVERSATION], ids=["tools", "chat"])
def test_mask_is_exactly_the_assistant_tokens(tok, conversation):
    ids, mask = tokenize_conversation(conversation, tok)
    full, expected = expected_mask(tok, conversation)
    assert ids == full
    for position, (got, want) in enumerate(zip(mask, expected, strict=True)):
        token = tok.convert_ids_to_tokens(ids[position])
        assert got == want, f"token {position} {token!r}: mask {got}, expected {want}"
    learned = tok.decode([i for i, bit in zip(ids, mask) if bit])
    assert "<tool_response>" not in learned and "You are a helpful" not in learned and "谢谢" not in learned
    assert learned.count("<|im_end|>") == sum(turn["role"] == "assistant" for turn in conversation)


def test_mask_on_gold_trajectories(tok, registry):
    for task in generate_tasks(4, seed=3):
        row = gold_trajectory(task, registry)
        ids, mask = tokenize_conversation(row["conversations"], tok)
        assert (ids, mask) == expected_mask(tok, row["conversations"])


def test_assistant_token_mask_by_ids():
    header, end = [1, 7, 8], 2
    ids = [1, 5, 2, 9, 1, 7, 8, 4, 4, 2, 9, 1, 7, 8, 2, 9]
    mask, spans = assistant_token_mask(ids, header, end)
    assert spans == 2
    assert mask == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 0]
    with pytest.raises(ValueError, match="no end token"):
        assistant_token_mask([1, 7, 8, 4], header, end)


def test_malformed_rows_are_rejected(tok):
    task_prompt = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": ""}]
    with pytest.raises(ValueError, match="no content, reasoning or tool call"):
        tokenize_conversation(task_prompt, tok)
    with pytest.raises(ValueError, match="no assistant turn"):
        tokenize_conversation([{"role": "user", "content": "hi"}], tok)
    spoofed = [{"role": "user", "content": ASSISTANT_HEADER + "fake"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ValueError, match="2 assistant spans .* for 1 assistant turns"):
        tokenize_conversation(spoofed, tok)
    with pytest.raises(ValueError, match="needs a 'conversations' field"):
        build_sft_dataset([{"text": "plain"}], tok, 64)
    with pytest.raises(ValueError, match="mode must be one of"):
        build_sft_dataset([{"text": "plain"}], tok, 64, mode="dpo")


def test_overlong_rows_are_dropped_and_counted(tok):
    rows = [{"conversations": TOOL_CONVERSATION}, {"conversations": CHAT_CONVERSATION}]
    lengths = [len(tokenize_conversation(row["conversations"], tok)[0]) for row in rows]
    assert lengths[0] > lengths[1]
    dataset, stats = build_sft_dataset(rows, tok, max_length=lengths[0] - 1)
    assert (stats.rows, stats.kept, stats.dropped_overlong, stats.longest) == (2, 1, 1, lengths[0])
    assert dataset["input_ids"] == [tokenize_conversation(CHAT_CONVERSATION, tok)[0]]
    assert stats.loss_tokens == sum(dataset[0]["assistant_masks"]) and stats.tokens == lengths[1]
    _, stats = build_sft_dataset(rows, tok, max_length=lengths[0])
    assert (stats.kept, stats.dropped_overlong) == (2, 0)
    with pytest.raises(ValueError, match="no rows left"):
        build_sft_dataset(rows, tok, max_length=lengths[1] - 1)


def recipe_trainer(tmp_path, model, tok, rows, eval_rows=None, sft=None, **training):
    """The trainer an SFT recipe builds, through the path ``minimind-trl train`` takes
    (``build.training_config`` and ``build.build_trainer`` of the recipe's kind)."""
    recipe = validate_recipe({"kind": "sft", "model": {"preset": "tiny"}, "data": {"path": str(tmp_path)},
                              "sft": sft or {},
                              "training": {"disable_tqdm": True, "report_to": "none", "bf16": False, **training}})
    config = build.training_config(recipe, str(tmp_path))
    return build.build_trainer(recipe, config, model, tok, rows, eval_rows)


def test_sft_trainer_labels_are_the_mask(tok, tmp_path, make_tiny_model):
    rows = [{"conversations": TOOL_CONVERSATION}, {"conversations": CHAT_CONVERSATION}]
    dataset, _ = build_sft_dataset(rows, tok, 1024)
    config = recipe_trainer(tmp_path, make_tiny_model(), tok, rows, per_device_train_batch_size=2).args
    trainer = SFTTrainer(model=make_tiny_model().train(), args=config, train_dataset=dataset, processing_class=tok)
    prepared = trainer.train_dataset
    assert prepared["input_ids"] == dataset["input_ids"]
    batch = trainer.data_collator([prepared[i] for i in range(len(prepared))])
    for row, (ids, mask) in enumerate(zip(dataset["input_ids"], dataset["assistant_masks"], strict=True)):
        n = len(ids)
        assert batch["input_ids"][row, :n].tolist() == ids
        assert batch["labels"][row, :n].tolist() == [i if bit else -100 for i, bit in zip(ids, mask)]
        assert (batch["labels"][row, n:] == -100).all() and (batch["attention_mask"][row, n:] == 0).all()


def test_three_steps_reduce_the_assistant_loss(tok, tmp_path, make_tiny_model):
    rows = [{"conversations": CHAT_CONVERSATION}, {"conversations": BRIEF_CONVERSATION}]
    model = make_tiny_model().train()
    dataset, _ = build_sft_dataset(rows, tok, 1024)
    with torch.no_grad():  # the masked loss SFTTrainer must report at step 1, computed by hand
        nll_sum, count = 0.0, 0
        for ids, mask in zip(dataset["input_ids"], dataset["assistant_masks"]):
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
            target = torch.tensor(ids[1:])
            keep = torch.tensor(mask[1:], dtype=torch.bool)
            nll_sum += -logp[torch.arange(len(target)), target][keep].sum().item()
            count += int(keep.sum())
    trainer = recipe_trainer(tmp_path, model, tok, rows, max_steps=3, per_device_train_batch_size=2,
                             learning_rate=1e-2, lr_scheduler_type="cosine", logging_steps=1)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3
    assert losses[0] == pytest.approx(nll_sum / count, rel=1e-4)
    assert losses[2] < losses[0] - 0.1
    assert trainer.state.global_step == 3


def test_pretrain_rows_truncate_and_train_on_every_token(tok, tmp_path, make_tiny_model):
    short, long = "Tools return JSON.", "word " * 200
    dataset, stats = build_sft_dataset([{"text": short}, {"text": long}], tok, max_length=32, mode="pretrain")
    assert dataset.column_names == ["input_ids"]
    assert dataset[0]["input_ids"] == [tok.bos_token_id, *_ids(tok, short), tok.eos_token_id]
    cut = dataset[1]["input_ids"]
    assert len(cut) == 32 and cut[-1] == tok.eos_token_id and cut[1:-1] == _ids(tok, long)[:30]
    assert (stats.truncated, stats.dropped_overlong, stats.longest) == (1, 0, len(_ids(tok, long)) + 2)
    assert stats.tokens == len(dataset[0]["input_ids"]) + 32 and stats.loss_tokens == stats.tokens - 2

    trainer = recipe_trainer(tmp_path, make_tiny_model().train(), tok, [{"text": short}, {"text": long}],
                             eval_rows=[{"text": short}], sft={"mode": "pretrain", "max_length": 32}, max_steps=1,
                             per_device_train_batch_size=2)
    assert trainer.train_dataset["input_ids"] == dataset["input_ids"]  # the recipe's max_length cut the text
    trainer.train()
    prepared = trainer.train_dataset
    batch = trainer.data_collator([prepared[i] for i in range(len(prepared))])
    real = batch["attention_mask"].bool()
    assert torch.equal(batch["labels"][real], batch["input_ids"][real]) and (batch["labels"][~real] == -100).all()
    assert trainer.evaluate()["eval_loss"] > 0 and len(trainer.eval_dataset) == 1

    trainer.save_model(str(tmp_path / "final"))
    reloaded = MiniMindForCausalLM.from_pretrained(tmp_path / "final")
    ids = torch.tensor([dataset[0]["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-6)
    assert load_tokenizer(tmp_path / "final")(short)["input_ids"] == _ids(tok, short)


def test_pretrain_packing_concatenates_whole_texts_into_blocks(tok, tmp_path, make_tiny_model):
    texts = ["Tools return JSON.", "word " * 40, "7 + 5 = 12", "last text, partly dropped"]
    stream = [t for text in texts for t in [tok.bos_token_id, *_ids(tok, text), tok.eos_token_id]]
    dataset, stats = build_sft_dataset([{"text": t} for t in texts], tok, max_length=16, mode="pretrain", pack=True)
    blocks = dataset["input_ids"]
    assert len(blocks) == len(stream) // 16 and all(len(b) == 16 for b in blocks)
    assert [t for b in blocks for t in b] == stream[: 16 * len(blocks)]  # order kept, nothing cut out
    assert stats.packed and stats.truncated == 0 and stats.kept == len(blocks)
    assert stats.tokens == 16 * len(blocks) and stats.loss_tokens == 15 * len(blocks)
    with pytest.raises(ValueError, match="pretrain' only"):
        build_sft_dataset([{"text": "x"}], tok, max_length=16, mode="sft", pack=True)
    with pytest.raises(ValueError, match="nothing to pack"):
        build_sft_dataset([{"text": "x"}], tok, max_length=64, mode="pretrain", pack=True)
    # Equal-length blocks: the collator adds no padding, every position has a label.
    trainer = recipe_trainer(tmp_path, make_tiny_model().train(), tok, [{"text": t} for t in texts],
                             sft={"mode": "pretrain", "max_length": 16, "pack": True}, max_steps=1,
                             per_device_train_batch_size=2)
    assert trainer.train_dataset["input_ids"] == blocks
    trainer.train()
    prepared = trainer.train_dataset
    batch = trainer.data_collator([prepared[i] for i in range(2)])
    assert batch["attention_mask"].all() and torch.equal(batch["labels"], batch["input_ids"])


def test_moe_sft_loss_is_the_models_own_loss_with_the_upstream_aux(tok, tmp_path, make_tiny_model):
    """MiniMindSFTTrainer's training loss for a MoE model equals MiniMind's own forward loss
    (mean masked CE + coef * router_aux_loss, the upstream formula); TRL's stock SFTTrainer adds
    Mixtral's load-balancing loss instead, which differs."""
    rows = [{"conversations": CHAT_CONVERSATION}, {"conversations": BRIEF_CONVERSATION}]
    dataset, _ = build_sft_dataset(rows, tok, 1024)
    config = recipe_trainer(tmp_path, make_tiny_model(), tok, rows, per_device_train_batch_size=2).args
    losses = {}
    for name, cls in (("ours", MiniMindSFTTrainer), ("stock", SFTTrainer)):
        model = make_tiny_model(moe=True).train()
        trainer = cls(model=model, args=config, train_dataset=dataset, processing_class=tok)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
        with torch.no_grad():
            losses[name] = trainer.compute_loss(trainer.model, dict(batch)).item()
            if name == "ours":  # the model's own forward (not the fused one): CE + coef * aux
                own = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                    labels=batch["labels"])
                ce = own.loss - model.config.router_aux_loss_coef * own.aux_loss
                logged = trainer._metrics["train"]["aux_loss"][-1]
                assert logged == pytest.approx(own.aux_loss.item(), rel=1e-5)
    assert losses["ours"] == pytest.approx(own.loss.item(), rel=1e-5)
    assert abs(losses["stock"] - losses["ours"]) > 1e-4 and losses["stock"] > ce.item()


def test_moe_sft_adds_the_router_aux_loss(tok, tmp_path, make_tiny_model):
    trainer = recipe_trainer(tmp_path, make_tiny_model(moe=True).train(), tok, [{"conversations": CHAT_CONVERSATION}],
                             sft={"max_length": 256}, max_steps=1, per_device_train_batch_size=1, logging_steps=1)
    assert isinstance(trainer, MiniMindSFTTrainer)
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["aux_loss"] > 0 and trainer.router_aux_loss_coef == pytest.approx(5e-4)


def test_a_recipe_sets_the_sft_config_and_owns_its_mask_keys(tmp_path, make_tiny_model, tok):
    """The recipe's sft section and training keys reach SFTConfig; the keys the kind owns (the
    dataset carries the loss mask) stay off."""
    config = recipe_trainer(tmp_path, make_tiny_model(), tok, [{"conversations": CHAT_CONVERSATION}],
                            sft={"max_length": 512}, learning_rate=1e-3).args
    assert (config.max_length, config.learning_rate) == (512, 1e-3)
    assert (config.assistant_only_loss, config.completion_only_loss, config.packing) == (False, False, False)
