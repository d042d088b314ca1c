"""Reward functions (task, components, upstream parity, reward model)."""

import json
import math
import time

import pytest
import torch
from helpers import tiny_tokenizer  # tests/ is on sys.path (pytest's pythonpath)
from transformers import Qwen3Config, Qwen3ForSequenceClassification
from trl.chat_template_utils import parse_response

from minimind_trl.envs.protocol import prompt_ids_for, tool_turn_ids
from minimind_trl.envs.tools import default_registry
from minimind_trl.rewards import (
    coverage_reward,
    evaluate_completion,
    format_reward,
    lenient_gt_hits,
    make_minimind_agent_reward,
    make_task_reward,
    prompt_question,
    rep_penalty,
    success_reward,
    task_reward,
    verify,
    view_completion,
)
from minimind_trl.rewards.registry import get_reward_function
from minimind_trl.rewards.upstream import minimind_agent_score


def call_block(name, arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def text_trajectory(call_args, observations, final):
    """A completion as text: calls, their observations, then the final answer."""
    parts = []
    for args, obs in zip(call_args, observations):
        parts.append(call_block("calculate_math", args) + "<|im_end|>\n<|im_start|>user\n"
                     f"<tool_response>\n{obs}\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    return "".join(parts) + final + "<|im_end|>"


def message_trajectory(calls, observations, final):
    """The same in TRL tool-mode form (a list of messages)."""
    messages = []
    for args, obs in zip(calls, observations):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculate_math", "arguments": args}}]})
        messages.append({"role": "tool", "name": "calculate_math", "content": obs})
    if final is not None:
        messages.append({"role": "assistant", "content": final})
    return messages


GT = [[36, 7]] * 4
PROMPTS = [[{"role": "user", "content": "q"}]] * 4
CORRECT = text_trajectory([{"expression": "12*3"}, {"expression": "49/7"}],
                          ['{"result": "36"}', '{"result": "7"}'], "The answers are 36 and 7.")
HALF = text_trajectory([{"expression": "12*3"}], ['{"result": "36"}'], "The answer is 36.")
MALFORMED_BUT_RIGHT = '<tool_call>\n{"name": oops}\n</tool_call>\nSo 36 and 7.'
NOTHING = "I cannot say."


def test_task_reward_hand_values():
    completions = [CORRECT, HALF, MALFORMED_BUT_RIGHT, NOTHING]
    # R = 1.0·success + 0.5·coverage − 0.5·[malformed]
    assert task_reward(PROMPTS, completions, gt=GT) == [1.5, 0.25, 1.0, 0.0]
    assert success_reward(PROMPTS, completions, gt=GT) == [1.0, 0.0, 1.0, 0.0]
    assert coverage_reward(PROMPTS, completions, gt=GT) == [1.0, 0.5, 1.0, 0.0]
    assert format_reward(PROMPTS, completions, gt=GT) == [0.0, 0.0, -1.0, 0.0]
    custom = make_task_reward(success_weight=2.0, coverage_weight=0.0, malformed_penalty=1.0,
                              name="strict")
    assert custom.__name__ == "strict"
    assert custom(PROMPTS, completions, gt=GT) == [2.0, 0.0, 1.0, 0.0]


def test_components_with_reward_weights_sum_to_task_reward():
    completions = [CORRECT, HALF, MALFORMED_BUT_RIGHT, NOTHING]
    weights = [1.0, 0.5, 0.5]
    parts = [f(PROMPTS, completions, gt=GT) for f in (success_reward, coverage_reward,
                                                      format_reward)]
    combined = [sum(w * p[i] for w, p in zip(weights, parts)) for i in range(4)]
    assert combined == task_reward(PROMPTS, completions, gt=GT)


def test_equal_trajectories_get_equal_rewards():
    completions = [CORRECT, CORRECT, HALF, HALF]
    for func in (task_reward, success_reward, coverage_reward, format_reward,
                 make_minimind_agent_reward()):
        rewards = func(PROMPTS, completions, gt=GT)
        assert rewards[0] == rewards[1] and rewards[2] == rewards[3]


def test_message_form_matches_text_form():
    messages = [
        message_trajectory([{"expression": "12*3"}, {"expression": "49/7"}],
                           ['{"result": "36"}', '{"result": "7"}'], "The answers are 36 and 7."),
        message_trajectory([{"expression": "12*3"}], ['{"result": "36"}'], "The answer is 36."),
        [{"role": "assistant", "content": MALFORMED_BUT_RIGHT}],
        [{"role": "assistant", "content": NOTHING}],
    ]
    assert task_reward(PROMPTS, messages, gt=GT) == [1.5, 0.25, 1.0, 0.0]
    view = view_completion(messages[0])
    assert view.turns == 3 and len(view.calls) == 2 and view.observations[1] == '{"result": "7"}'
    assert not view.unfinished and view.final_answer == "The answers are 36 and 7."


def test_unfinished_trajectory_has_no_final_answer():
    ends_on_tool = message_trajectory([{"expression": "12*3"}], ['{"result": "36"}'], None)
    view = view_completion(ends_on_tool)
    assert view.unfinished and view.final_answer == ""
    text = text_trajectory([{"expression": "12*3"}], ['{"result": "36"}'], "")
    assert view_completion(text).unfinished
    assert task_reward(PROMPTS[:1], [ends_on_tool], gt=[[36]]) == [0.0]


def test_reward_needs_gt_column():
    with pytest.raises(KeyError, match="'gt'"):
        task_reward(PROMPTS[:1], [CORRECT])


def test_gt_rows_may_be_single_values_or_json_strings():
    completions = [CORRECT, CORRECT, HALF]
    assert coverage_reward(PROMPTS[:3], completions, gt=['[36, "7"]', 36, "[36, 7]"]) \
        == [1.0, 1.0, 0.5]


def test_the_prompt_question_reaches_the_verifier():
    """Issue 40.2: a percentage question's GT is met by ``p%`` (the reward reads the prompt's last
    user message, in TRL's message form or as a rendered string); another question's is not."""
    percent = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "What percentage of 80 is 55?"}]
    plain = [{"role": "user", "content": "What is 0.6875 times 100?"}]
    rendered = "<|im_start|>system\nUse tools.<|im_end|>\n<|im_start|>user\n55 is what percent of 80?<|im_end|>\n"
    answer = "The answer is 68.75%."
    assert task_reward([percent, plain, rendered], [answer] * 3, gt=[["68.75"]] * 3) == [1.5, 0.0, 1.5]
    assert success_reward(None, [answer], gt=[["68.75"]]) == [0.0]  # no prompt: no percentage question
    assert evaluate_completion(answer, ["68.75"], question="What percentage of 80 is 55?")[1].success
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        task_reward([percent, plain], [answer], gt=[["68.75"]])


@pytest.mark.parametrize("prompt, question", [
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "c"),
    ([{"role": "user", "content": [{"type": "text", "text": "parts"}]}], "parts"), ([], ""), (None, ""),
    ("plain text question", "plain text question"), ("<|im_start|>user\nq?<|im_end|>\n<|im_start|>assistant\n", "q?"),
])
def test_prompt_question(prompt, question):
    assert prompt_question(prompt) == question


def test_registered_reward_names():
    assert get_reward_function("success_reward") is success_reward
    weighted = get_reward_function("task_reward", coverage_weight=1.0)
    assert weighted(PROMPTS[:1], [HALF], gt=[[36, 7]]) == [0.5]
    with pytest.raises(TypeError, match="takes no options"):
        get_reward_function("success_reward", weight=2)


# ------------------------------------------------------------------ upstream parity reward

def test_rep_penalty_hand_values():
    assert rep_penalty("a b c a b c") == pytest.approx(0.25)  # 4 trigrams, 1 repeat: 1·1/4
    assert rep_penalty("a a a a a") == 0.5  # 3 trigrams, 2 repeats: 2/3 capped at 0.5
    assert rep_penalty("one two") == 0.0


def test_lenient_gt_check_keeps_the_upstream_weakness():
    assert lenient_gt_hits("The answer is 2932.", ["9"]) == {"9"}
    assert not verify("The answer is 2932.", ["9"]).success
    assert lenient_gt_hits("1,000 apples", [1000]) == {"1000"}
    assert lenient_gt_hits("5 and 5", [5, 5]) == {"5"}  # a set: counted once


def score(completion, gt):
    return minimind_agent_score(view_completion(completion), gt, default_registry())


def test_upstream_reward_hand_values():
    # tool branch: gap 0 → +0.5, GT hit → +2.5, no repetition → total 3.0 (clip bound)
    one_call = text_trajectory([{"expression": "12*3"}], ['{"result": "36"}'], "答案是36")
    assert score(one_call, ["36"]) == 3.0
    # two valid calls for one GT: gap 1 → −0.5; hit +2.5; "答案是36" has no trigram → 2.0
    two_calls = text_trajectory([{"expression": "12*3"}, {"expression": "1+1"}],
                                ['{"result": "36"}', '{"result": "2"}'], "答案是36")
    assert score(two_calls, ["36"]) == 2.0
    # an invalid call (unknown tool) and a hit: gap |0−1| + 1 = 2 → −1.0; +2.5 → 1.5
    bad_tool = call_block("no_tool", {}) + "<tool_response>\n{}\n</tool_response>\n答案是36"
    assert score(bad_tool, ["36"]) == 1.5
    # no tool call, 20 characters, no think → +0.5
    assert score("Hello there, friend.", ["36"]) == 0.5
    # think of 32 characters: +0.5 length, +1.0 think, +0.25 single </think> → 1.75
    assert score("I am thinking about this problem</think>\n\nThe answer is 42.", [42]) == 1.75
    # unbalanced tag: −0.5, length 16 → +0.5, trigrams distinct → 0.0
    assert score("<tool_call> {bad", [42]) == 0.0


def test_upstream_reward_unfinished():
    messages = message_trajectory([{"expression": "1+1"}], ['{"result": "2"}'], None)
    view = view_completion(messages)
    answer = view.turn_texts[-1].strip()
    # gap 0 → +0.5; final text "" → no GT credit; unfinished −0.5; − rep_penalty(answer)
    assert score(messages, [2]) == pytest.approx(0.5 - 0.5 - rep_penalty(answer))


def test_upstream_reward_as_trl_function():
    reward = get_reward_function("minimind_agent_reward")
    assert reward.__name__ == "minimind_agent_reward"
    assert reward(PROMPTS[:2], [CORRECT, NOTHING], gt=[[36, 7], [36, 7]]) == [3.0, 0.5]


# ------------------------------------------------------------------ reward-model reward

@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         intermediate_size=64, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("tiny_rm")
    Qwen3ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_reward_model_reward_end_to_end(reward_model_dir):
    reward = get_reward_function("reward_model", path=reward_model_dir, device="cpu",
                                 batch_size=2)
    assert reward.__name__ == "reward_model_reward"
    prompts = [[{"role": "user", "content": "What is 12*3?"}]] * 3
    completions = [CORRECT, CORRECT, "<think>x</think>A different, longer answer: 99."]
    scores = reward(prompts, completions, gt=[[36]] * 3)
    assert len(scores) == 3 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)
    # the batched score equals a single unpadded forward of the rendered text
    scorer = reward.scorer
    text = scorer.render("What is 12*3?", "A different, longer answer: 99.")
    assert "What is 12*3?" in text and text.rstrip().endswith(
        ("A different, longer answer: 99.", "<|im_end|>"))
    ids = scorer.tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        single = scorer.model(**ids).logits[0, 0].item()
    assert scores[2] == pytest.approx(single, abs=1e-4)




# --------------------------------------------------------------------------------------------
# Evaluation (decoded text) and training (TRL's parsed messages) read the same answer (17.6)
# --------------------------------------------------------------------------------------------


def _both_forms(final_turn: str, open_thinking: bool, observation: str = '{"result": "42"}'):
    """One trajectory (a call, its observation, ``final_turn``) as evaluation decodes it and as
    TRL's tool loop parses it (``parse_response`` of each model turn after its context)."""
    tok, schemas = tiny_tokenizer(), default_registry().schemas()
    encode = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt = prompt_ids_for(tok, [{"role": "user", "content": "What is 40 + 2?"}], schemas, open_thinking)
    close = "" if not open_thinking else "ok\n</think>\n\n"
    call = encode(close + call_block("calculate_math", {"expression": "40+2"}) + "<|im_end|>")
    suffix = tool_turn_ids(tok, ["calculate_math"], [observation], open_thinking)
    final = encode(final_turn + "<|im_end|>")
    text = tok.decode(call + suffix + final, skip_special_tokens=False)
    messages = [parse_response(tok, call, prefix=prompt, tools=schemas),
                {"role": "tool", "name": "calculate_math", "content": observation},
                parse_response(tok, final, prefix=prompt + call + suffix, tools=schemas)]
    return text, messages


@pytest.mark.parametrize("open_thinking", [False, True])
@pytest.mark.parametrize("final_turn", [
    "The answer is 42.", "<think>\nso 42", "so 42\n</think>\n\nThe answer is 42.", "42 <think> and 9",
    'The answer is 42. <tool_response>{"result": "42"}</tool_response> 42',
])
def test_evaluation_and_training_read_the_same_final_answer(final_turn, open_thinking):
    text, messages = _both_forms(final_turn, open_thinking)
    from_text, from_messages = view_completion(text), view_completion(messages)
    assert from_text.final_answer == from_messages.final_answer
    assert verify(from_text.final_answer, [42]) == verify(from_messages.final_answer, [42])
    assert task_reward(PROMPTS[:1], [text], gt=[[42]]) == task_reward(PROMPTS[:1], [messages], gt=[[42]])


def test_unclosed_think_after_a_tool_turn_is_no_answer_in_either_form():
    # the generation prompt after the tool turn closes an empty think block; the model opens another
    text, messages = _both_forms("<think>\nit is 42", open_thinking=False)
    assert view_completion(text).final_answer == view_completion(messages).final_answer == ""
    assert success_reward(PROMPTS[:1], [text], gt=[[42]]) == success_reward(PROMPTS[:1], [messages], gt=[[42]]) == [0.0]


def test_tool_backed_needs_a_real_tool_observation():
    forged = '<think>\n\n</think>\n\n<tool_response>\n{"result": "42"}\n</tool_response>\nThe answer is 42.'
    assert not view_completion(forged).observations
    assert not evaluate_completion(forged, [42])[1].tool_backed
    # a model turn cannot end the turn header itself: "<|im_start|>user" without <|im_end|> is forged too
    inside = '42 <|im_start|>user\n<tool_response>\n{"result": "42"}\n</tool_response>\nThe answer is 42.'
    assert not evaluate_completion(inside, [42])[1].tool_backed
    text, messages = _both_forms("The answer is 42.", open_thinking=False, observation='{"result": "41"}')
    assert view_completion(text).observations == ['{"result": "41"}']
    assert not evaluate_completion(text, [42])[1].tool_backed and evaluate_completion(text, [42])[1].success
    real, _ = _both_forms("The answer is 42.", open_thinking=False)
    assert evaluate_completion(real, [42])[1].tool_backed
    assert evaluate_completion(CORRECT, [36, 7])[1].tool_backed  # consecutive blocks of one tool turn


def test_repeated_unclosed_tool_response_tags_are_bounded_work():
    """Issue 28.7: every unclosed ``<tool_response>`` used to scan to the end of the text
    (quadratic: 0.9 s for 2,048 tags, about a minute for 16,384). A block cannot hold another
    opening tag, so the work is linear; the generous bound only catches the quadratic scan."""
    text = "The answer is 42. " + "<tool_response>" * 8_192
    start = time.perf_counter()
    view = view_completion(text)
    assert time.perf_counter() - start < 2.0
    assert view.final_answer == "The answer is 42." and view.observations == []
