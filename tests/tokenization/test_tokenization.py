"""Chat template, shipped tokenizer layout, TRL tool-calling support and folder loading."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer
from trl import GRPOTrainer
from trl.chat_template_utils import (
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    is_chat_template_stop_token_trained,
    parse_response,
    supports_tool_calling,
)

from minimind_trl.tokenization import (
    CHAT_TEMPLATE,
    DEFAULT_TOKENIZER_DIR,
    RESPONSE_TEMPLATE,
    load_tokenizer,
    normalize_conversation,
)
from minimind_trl.tokenization.vocab import ADDED_TOKENS, FIRST_BYTE_ID, fixed_tokens

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate_math",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        },
    },
}
CONVERT_TOOL = {
    "type": "function",
    "function": {
        "name": "unit_converter",
        "description": "Convert a value between units.",
        "parameters": {
            "type": "object",
            "properties": {"value": {"type": "number"}, "from_unit": {"type": "string"}, "to_unit": {"type": "string"}},
            "required": ["value", "from_unit", "to_unit"],
        },
    },
}


@pytest.fixture
def tok(tokenizer):
    """The shared packaged tokenizer (conftest), under this file's short name."""
    return tokenizer


def _golden_cases(reference_dir):
    lines = (reference_dir / "chat_cases.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _render(tok, case, tokenize=False):
    kwargs = {"open_thinking": case["open_thinking"]} if "open_thinking" in case else {}
    return tok.apply_chat_template(
        case["messages"],
        tools=case["tools"],
        add_generation_prompt=case["add_generation_prompt"],
        tokenize=tokenize,
        **kwargs,
    )


def test_golden_cases_render_byte_exact(tok, reference_dir):
    cases = _golden_cases(reference_dir)
    assert len(cases) >= 10
    for index, case in enumerate(cases):
        assert _render(tok, case) == case["expected_text"], f"golden case {index}"


def _as_text_parts(content):
    """OpenAI-style list content carrying the same text, split in two parts ("" -> no parts)."""
    half = len(content) // 2
    return [{"type": "text", "text": piece} for piece in (content[:half], content[half:]) if piece]


def test_golden_cases_render_the_same_with_list_content_and_enable_thinking(tok, reference_dir):
    """What OpenAI-style clients send (content as text parts, Qwen3's `enable_thinking` flag)
    renders byte for byte as the golden text."""
    for index, case in enumerate(_golden_cases(reference_dir)):
        messages = [dict(m, content=_as_text_parts(m["content"])) if isinstance(m.get("content"), str) else m
                    for m in case["messages"]]
        kwargs = {"enable_thinking": case["open_thinking"]} if "open_thinking" in case else {}
        rendered = tok.apply_chat_template(messages, tools=case["tools"], tokenize=False,
                                           add_generation_prompt=case["add_generation_prompt"], **kwargs)
        assert rendered == case["expected_text"], f"golden case {index}"


def test_enable_thinking_is_an_alias_and_parts_must_be_text(tok):
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}]
    def prompt(**kwargs):
        return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    assert prompt(enable_thinking=True) == prompt(open_thinking=True) == "<|im_start|>user\nhi there<|im_end|>\n" \
        "<|im_start|>assistant\n<think>\n"
    assert prompt(enable_thinking=False) == prompt() == prompt(enable_thinking=True, open_thinking=False)
    assert prompt(enable_thinking=False).endswith("<think>\n\n</think>\n\n")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}}]}]
    with pytest.raises(Exception, match=r"user content parts must be \{\"type\": \"text\""):
        tok.apply_chat_template(image, tokenize=False)
    with pytest.raises(Exception, match="string or a list of text parts"):
        tok.apply_chat_template([{"role": "user", "content": 7}], tokenize=False)


def test_golden_special_and_byte_ids_match_upstream(tok, reference_dir):
    """Ids below 36 (special/added tokens) appear in the same order as upstream's; bytes share ids."""
    for index, case in enumerate(_golden_cases(reference_dir)):
        ours = tok(case["expected_text"], add_special_tokens=False)["input_ids"]
        theirs = case["expected_ids_upstream_tokenizer"]
        assert [i for i in ours if i < FIRST_BYTE_ID] == [i for i in theirs if i < FIRST_BYTE_ID], index
    # Single-byte tokens seen in the goldens: '+' 46, '1' 52, '4' 55, '?' 66, '\n' 234, ' ' 256.
    for char, upstream_id in {"+": 46, "1": 52, "4": 55, "?": 66, "\n": 234, " ": 256}.items():
        assert tok(char, add_special_tokens=False)["input_ids"] == [upstream_id]


def test_shipped_tokenizer_layout(tok):
    assert len(tok) == 6400
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 0, 1, 2)
    assert tok.convert_ids_to_tokens(list(range(FIRST_BYTE_ID))) == fixed_tokens()
    assert [tok.convert_tokens_to_ids(t) for t in ADDED_TOKENS] == list(range(21, 27))
    assert tok.convert_ids_to_tokens(FIRST_BYTE_ID) == "!"
    # No automatic bos/eos; the tags are single tokens and survive skip_special_tokens.
    text = "<|im_start|>hi<think>\nx\n</think><tool_call>{}</tool_call><tool_response>r</tool_response><|im_end|>"
    ids = tok(text)["input_ids"]
    assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == 1
    assert all(tok.convert_tokens_to_ids(t) in ids for t in ADDED_TOKENS)
    assert tok.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    assert tok("hello")["input_ids"] == tok("hello", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps over the lazy dog.",
        "天空为什么是蓝色的？因为瑞利散射让短波长的光散射得更多。",
        "0123456789 3.14159 -42 1e-7 20758280",
        '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "256 * 37"}}\n</tool_call>',
        '{"result": "9472"}  tabs\tand\n\nnewlines  ',
        "emoji 🙂 and accents café, naïve; 日本語も",
    ],
)
def test_round_trip(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_digits_are_single_tokens(tok):
    ids = tok("20758280", add_special_tokens=False)["input_ids"]
    assert len(ids) == 8


def test_trl_tool_calling_checks_pass(tok):
    assert supports_tool_calling(tok)
    assert is_chat_template_prefix_preserving(tok)
    assert is_chat_template_stop_token_trained(tok)
    assert get_training_chat_template(tok) is None  # TRL keeps our template as is


@pytest.mark.parametrize("open_thinking", [False, True])
def test_rendered_tool_calls_parse_back_through_trl(tok, open_thinking):
    messages = [{"role": "user", "content": "先算 3*7，再把 5 km 换成 m"}]
    calls = [
        {"type": "function", "function": {"name": "calculate_math", "arguments": {"expression": "3*7"}}},
        {"type": "function", "function": {"name": "unit_converter",
                                          "arguments": {"value": 5, "from_unit": "km", "to_unit": "m"}}},
    ]
    assistant = {"role": "assistant", "content": "我来算。", "tool_calls": calls}
    if open_thinking:
        assistant["reasoning_content"] = "Two tools are needed."
    tools = [CALC_TOOL, CONVERT_TOOL]
    prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False,
                                     open_thinking=open_thinking)
    full = tok.apply_chat_template(messages + [assistant], tools=tools, tokenize=False)
    assert full.startswith(prompt)  # prompt + what the model writes == the rendered conversation
    completion = full[len(prompt):].removesuffix("\n")
    assert completion.endswith("<|im_end|>")
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
    parsed = parse_response(tok, completion_ids, prefix=prompt_ids, tools=tools)
    assert parsed["content"] == "我来算。"
    assert parsed["tool_calls"] == calls
    assert parsed.get("reasoning_content", "") == assistant.get("reasoning_content", "")


@pytest.mark.parametrize("open_thinking", [False, True])
def test_trl_tool_loop_ids_equal_the_rendered_conversation(tok, open_thinking):
    """TRL builds prompt + completion + tool suffix by concatenating ids (its own
    `_get_tool_suffix_ids`); that must equal tokenizing the whole rendered conversation."""
    state = SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=None, _is_vlm=False,
                            chat_template_kwargs={"open_thinking": open_thinking})
    messages = [{"role": "user", "content": "7 的平方是多少？"}]
    assistant = {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function",
                                 "function": {"name": "calculate_math", "arguments": {"expression": "7**2"}}}]}
    if open_thinking:
        assistant["reasoning_content"] = "Use the calculator."
    tool_messages = [{"role": "tool", "name": "calculate_math", "content": '{"result": "49"}'}]

    def ids(conversation, **kwargs):
        return tok.apply_chat_template(conversation, tools=[CALC_TOOL], tokenize=True, return_dict=False,
                                       open_thinking=open_thinking, **kwargs)

    prompt_ids = ids(messages, add_generation_prompt=True)
    turn_ids = ids(messages + [assistant])
    assert turn_ids[: len(prompt_ids)] == prompt_ids
    assert turn_ids[-2:] == [tok.eos_token_id, tok.convert_tokens_to_ids("Ċ")]  # ...<|im_end|>\n
    completion_ids = turn_ids[len(prompt_ids) : -1]  # generation stops at <|im_end|>
    suffix_ids = GRPOTrainer._get_tool_suffix_ids(state, tool_messages)
    expected = ids(messages + [assistant] + tool_messages, add_generation_prompt=True)
    assert prompt_ids + completion_ids + suffix_ids == expected


def test_unclosed_thinking_and_plain_answers_parse(tok):
    prefix = tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True,
                                     tokenize=False, open_thinking=True)
    assert tok.parse_response("still thinking<|im_end|>", prefix=prefix) == {
        "role": "assistant", "reasoning_content": "still thinking"}
    prefix = tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False)
    assert tok.parse_response("The answer is 49.<|im_end|>", prefix=prefix) == {
        "role": "assistant", "content": "The answer is 49."}


def test_generation_prompt_switch(tok):
    messages = [{"role": "user", "content": "hi"}]
    closed = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    opened = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, open_thinking=True)
    assert closed.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert opened.endswith("<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize(("open_thinking", "reasoning"), [(False, None), (True, None), (True, "Seven sevens.")])
@pytest.mark.parametrize("content", ["The answer is 49.", "49", "答案是四十九。", " spaced", "\nnewline", ""])
def test_generation_prompt_ids_prefix_the_rendered_turn(tok, open_thinking, reasoning, content):
    """SFT renders whole conversations, RL tokenizes prompts: both must agree token by token."""
    messages = [{"role": "user", "content": "7*7?"}]
    assistant = {"role": "assistant", "content": content}
    if reasoning:
        assistant["reasoning_content"] = reasoning
    if not content:
        assistant["tool_calls"] = [{"name": "calculate_math", "arguments": {"expression": "7*7"}}]
    prompt_ids = tok.apply_chat_template(messages, tools=[CALC_TOOL], add_generation_prompt=True,
                                         open_thinking=open_thinking, tokenize=True, return_dict=False)
    full_ids = tok.apply_chat_template(messages + [assistant], tools=[CALC_TOOL], tokenize=True, return_dict=False)
    assert full_ids[: len(prompt_ids)] == prompt_ids


def test_assistant_mask_is_the_generated_part_and_ends_with_eos(tok):
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    spans, current = [], []
    for token_id, masked in zip(out["input_ids"], out["assistant_masks"]):
        if masked:
            current.append(token_id)
        elif current:
            spans.append(current)
            current = []
    assert [tok.decode(s) for s in spans] == ["two and two\n</think>\n\n4<|im_end|>", "6<|im_end|>"]


def test_every_assistant_turn_ends_with_eos(tok):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "calculate_math", "arguments": "{}"}]},
        {"role": "tool", "content": '{"result": "1"}'},
        {"role": "assistant", "content": "1"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False)
    turns = [t for t in text.split("<|im_start|>") if t.startswith("assistant")]
    assert len(turns) == 2 and all(t.endswith("<|im_end|>\n") for t in turns)


def _upstream_row():
    """An upstream-format SFT row: tools and tool_calls as JSON strings."""
    return [
        {"role": "system", "content": "你是一个AI助手。", "tools": json.dumps([CALC_TOOL], ensure_ascii=False)},
        {"role": "user", "content": "256 乘以 37"},
        {"role": "assistant", "content": "",
         "tool_calls": json.dumps([{"name": "calculate_math", "arguments": {"expression": "256 * 37"}}])},
        {"role": "tool", "content": '{"result": "9472"}'},
        {"role": "assistant", "content": "9472"},
    ]


def test_normalize_conversation_matches_tools_argument(tok):
    row = _upstream_row()
    messages, tools = normalize_conversation(row)
    assert tools == [CALC_TOOL] and "tools" not in messages[0]
    assert messages[2]["tool_calls"] == [
        {"type": "function", "function": {"name": "calculate_math", "arguments": {"expression": "256 * 37"}}}]
    assert isinstance(row[0]["tools"], str)  # input untouched
    rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": "256 * 37"}}\n</tool_call>' in rendered
    # A tools *list* on the system message is the fallback when tools= is absent; tools= wins.
    with_list = [dict(messages[0], tools=tools)] + messages[1:]
    assert tok.apply_chat_template(with_list, tokenize=False) == rendered
    assert "unit_converter" in tok.apply_chat_template(with_list, tools=[CONVERT_TOOL], tokenize=False)
    assert "calculate_math\", \"description" not in tok.apply_chat_template(
        with_list, tools=[CONVERT_TOOL], tokenize=False)


def test_upstream_strings_are_refused_by_the_template_with_a_pointer(tok):
    row = _upstream_row()
    with pytest.raises(Exception, match="normalize_conversation"):
        tok.apply_chat_template(row[:2], tokenize=False)
    with pytest.raises(Exception, match="normalize_conversation"):
        tok.apply_chat_template(row[1:3], tokenize=False)
    with pytest.raises(Exception, match="unknown message role 'robot'"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_normalize_conversation_errors_name_the_field():
    row = _upstream_row()
    row[0]["tools"] = "[{not json"
    with pytest.raises(ValueError, match=r"row 7\[0\]\.tools: not valid JSON"):
        normalize_conversation(row, "row 7")
    row = _upstream_row()
    row[2]["tool_calls"] = json.dumps([{"arguments": {}}])
    with pytest.raises(ValueError, match=r"conversations\[2\]\.tool_calls\[0\]: .*'name'"):
        normalize_conversation(row)
    with pytest.raises(ValueError, match=r"conversations\[1\]\.tools: tools may only"):
        normalize_conversation([{"role": "user", "content": "x", "tools": [CALC_TOOL]}, {"role": "user"}][::-1])


def test_shipped_folder_loads_standalone_with_template():
    auto = AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER_DIR))
    assert auto.chat_template == CHAT_TEMPLATE
    assert auto.response_template == RESPONSE_TEMPLATE
    assert (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id) == (1, 2, 0)
    assert len(auto) == 6400


def test_upstream_style_folder_gets_our_template(tmp_path):
    folder = tmp_path / "upstream"
    folder.mkdir()
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", folder / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ 'other template' }}",
              "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "unk_token": "<|endoftext|>", "model_max_length": 32768}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    loaded = load_tokenizer(folder)
    assert loaded.chat_template == CHAT_TEMPLATE and loaded.response_template == RESPONSE_TEMPLATE
    assert supports_tool_calling(loaded)

    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    for entry in spec["added_tokens"]:  # swap <|im_start|> and <|im_end|>
        entry["content"] = {"<|im_start|>": "<|im_end|>", "<|im_end|>": "<|im_start|>"}.get(entry["content"],
                                                                                        entry["content"])
    vocab = spec["model"]["vocab"]
    vocab["<|im_start|>"], vocab["<|im_end|>"] = vocab["<|im_end|>"], vocab["<|im_start|>"]
    (folder / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ValueError, match=r"upstream/tokenizer.json: <\|im_start\|> has id 2"):
        load_tokenizer(folder)


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
