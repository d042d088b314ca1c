"""Gold SFT trajectories and the upstream-schema -> chat-template message converter."""

import json
import re

import datasets
import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from minimind_trl.conversation import encode_tool_calls
from minimind_trl.data.formats import row_messages
from minimind_trl.data.generator import generate_tasks
from minimind_trl.data.gold import MAX_TOOL_TURNS, gold_file_rows, gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.fsio import DataError, DataFormatError, write_jsonl_atomic
from minimind_trl.tokenization.template import CHAT_TEMPLATE

CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(170, seed=5, registry=default_registry())


@pytest.fixture(scope="module")
def golds(tasks):
    registry = default_registry()
    return [gold_trajectory(task, registry) for task in tasks]


def test_one_call_per_gt_parallel_or_sequential(tasks, golds, registry):
    for task, gold in zip(tasks, golds):
        turns = gold["conversations"]
        assert gold["id"] == task["id"]
        assert turns[:2] == task["conversations"][:2]
        tool_turns = [turn for turn in turns if turn.get("tool_calls")]
        calls = [call for turn in tool_turns for call in json.loads(turn["tool_calls"])]
        assert calls == json.loads(task["meta"]["calls"])
        assert len(calls) == len(task["gt"]) and len(tool_turns) <= MAX_TOOL_TURNS
        if task["meta"]["op_type"] == "chain":
            assert [len(json.loads(turn["tool_calls"])) for turn in tool_turns] == [1] * len(calls)
        else:
            assert len(tool_turns) == 1
        observations = [turn["content"] for turn in turns if turn["role"] == "tool"]
        assert observations == [registry.call(c["name"], c["arguments"]) for c in calls]
        assert [json.loads(o)["result"] for o in observations] == task["gt"]
        for turn in tool_turns:
            assert turn["role"] == "assistant" and turn["content"] == ""


def test_final_answer_states_every_value_in_the_question_language(tasks, golds):
    for task, gold in zip(tasks, golds):
        final = gold["conversations"][-1]
        assert final["role"] == "assistant" and "tool_calls" not in final
        for value in task["gt"]:
            assert re.search(rf"(?<![\d.]){re.escape(value)}(?!\d|\.\d)", final["content"]), (value, final["content"])
        assert bool(CJK.search(final["content"])) == (task["meta"]["lang"] == "zh")
    assert gold_trajectory(tasks[0], default_registry()) == golds[0]  # deterministic wording, any registry


def test_roles_follow_the_upstream_sft_layout(golds):
    for gold in golds:
        roles = [turn["role"] for turn in gold["conversations"]]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant"
        body = "".join({"assistant": "a", "tool": "t"}[role] for role in roles[2:])
        assert re.fullmatch(r"(at+)+a", body), roles


def test_gold_refuses_tasks_it_cannot_replay(tasks, registry):
    upstream = {key: tasks[0][key] for key in ("conversations", "gt")}
    with pytest.raises(DataError, match="meta.calls"):
        gold_trajectory(upstream, registry)
    tampered = json.loads(json.dumps(tasks[0]))
    tampered["gt"][-1] = "123456789.5"
    with pytest.raises(DataError, match="gt"):
        gold_trajectory(tampered, registry)


def test_gold_file_errors_name_file_and_line(tasks, registry, tmp_path):
    broken = json.loads(json.dumps(tasks[1]))
    broken["meta"]["calls"] = "[{not json"
    path = write_jsonl_atomic(tmp_path / "tasks.jsonl", [tasks[0], broken])
    with pytest.raises(DataFormatError) as info:
        gold_file_rows(str(path), registry)
    assert info.value.line == 2 and info.value.field == "meta.calls" and str(path) in str(info.value)


def test_converter_gives_template_messages_even_after_datasets(golds, tmp_path):
    path = write_jsonl_atomic(tmp_path / "sft.jsonl", golds[:20])
    loaded = datasets.load_dataset("json", data_files=str(path), split="train")
    for gold, row in zip(golds, loaded):
        direct = row_messages(gold["conversations"])
        assert row_messages(row["conversations"]) == direct  # None-filled keys dropped
        messages, tools = direct
        assert tools == json.loads(gold["conversations"][0]["tools"])
        assert all("tools" not in message for message in messages)
        for message, turn in zip(messages, gold["conversations"]):
            if "tool_calls" in turn:
                assert message["tool_calls"] == [{"type": "function", "function": call}
                                                 for call in json.loads(turn["tool_calls"])]
                assert all(isinstance(c["function"]["arguments"], dict) for c in message["tool_calls"])


def test_converter_matches_golden_chat_case(reference_dir):
    cases = [json.loads(line) for line in (reference_dir / "chat_cases.jsonl").read_text(encoding="utf-8").splitlines()]
    case = next(c for c in cases if c["tools"] and any(m.get("tool_calls") for m in c["messages"])
                and not c["add_generation_prompt"])
    # the same conversation in the upstream JSONL schema, as our writers produce it
    conversations = []
    for index, message in enumerate(case["messages"]):
        turn = dict(message)
        if index == 0:
            turn["tools"] = json.dumps(case["tools"], ensure_ascii=False)
        if "tool_calls" in turn:
            turn["tool_calls"] = encode_tool_calls([call.get("function", call) for call in turn["tool_calls"]])
        conversations.append(turn)
    messages, tools = row_messages(conversations)
    assert tools == case["tools"]
    assert messages == [
        {**m, "tool_calls": [{"type": "function", "function": c.get("function", c)} for c in m["tool_calls"]]}
        if "tool_calls" in m else m for m in case["messages"]]


def test_gold_renders_with_the_chat_template(golds):
    gold = next(g for g in golds if sum(1 for t in g["conversations"] if t["role"] == "tool") >= 2)
    messages, tools = row_messages(gold["conversations"])
    (text,), _ = render_jinja_template([messages], tools=tools, chat_template=CHAT_TEMPLATE)
    calls = [call for turn in gold["conversations"] if turn.get("tool_calls")
             for call in json.loads(turn["tool_calls"])]
    for call in calls:
        body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
        assert f"<tool_call>\n{body}\n</tool_call>" in text
    after_system = text.split("<|im_start|>user", 1)[1]  # the system preamble shows the format itself
    assert after_system.count("<tool_call>") == len(calls)
    for turn in gold["conversations"]:
        if turn["role"] == "tool":
            assert f"<tool_response>\n{turn['content']}\n</tool_response>" in text
    assert text.endswith(gold["conversations"][-1]["content"] + "<|im_end|>\n")


def test_converter_errors_name_the_field():
    bad = [{"role": "system", "content": "x", "tools": "[not json"}, {"role": "user", "content": "hi"}]
    with pytest.raises(DataFormatError) as info:
        row_messages(bad, "f.jsonl", 7)
    assert info.value.field == "conversations[0].tools" and "f.jsonl:7" in str(info.value)
