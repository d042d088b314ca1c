"""The scripted rollout policy of the envs and eval tests: a tiny random MiniMind whose replies are
forced, per task and turn, by a logits processor, the tasks it answers, and an independent
rendering of a finished rollout to check the rollout's tokens against."""

import json

from transformers import LogitsProcessor, LogitsProcessorList

from minimind_trl.conversation import task_prompt
from minimind_trl.envs.protocol import prompt_ids_for

CALL = '<tool_call>\n{{"name": "calculate_math", "arguments": {{"expression": "{}"}}}}\n</tool_call>'
HOSTILE = "\n".join([
    CALL.format("9**9**9**9"),
    '<tool_call>\n{"name": "rm_rf", "arguments": {"path": "/"}}\n</tool_call>',
    CALL.format("__import__('os').system('ls')"),
    '<tool_call>\n{"name": "calculate_math", "arguments": {"expression": 7, "x": [1]}}\n</tool_call>',
    '<tool_call>\n{"name": "random_number", "arguments": {"min": "3", "max": "3"}}\n</tool_call>',
])
SCRIPTS = {
    "[call]": [CALL.format("3*7"), "The answer is 21."],
    "[hostile]": [HOSTILE, "I could not compute it."],
    "[malformed]": [CALL.format("1+1") + "\n<tool_call>not json</tool_call>"],
    "[loop]": [CALL.format(f"{k}+1") for k in range(6)],
    "[think]": ["Use the tool.\n</think>\n\n" + CALL.format("2*5"), "Done.\n</think>\n\nIt is 10."],
}


class ScriptedReplies(LogitsProcessor):
    """Forces the reply of turn k of a row whose context contains a script key to
    ``SCRIPTS[key][k]`` + ``<|im_end|>``; other rows generate freely. Turn k = (eos tokens in
    the context - 2) / 2 (system and user turns end with eos, then one per model / tool turn).
    A ``generate`` call may start inside a turn (the rollout decodes in slices): the part of the
    turn already written is what follows the generation prompt after the context's last eos.
    Pad ids are dropped first: the rollout aligns rows with pads inside the sequence."""

    def __init__(self, tokenizer, scripts):
        self.tokenizer, self.scripts, self.start, self.targets = tokenizer, scripts, None, None
        self.openers = []  # generation prompts after an eos: think block closed, then opened
        for open_thinking in (False, True):
            ids = prompt_ids_for(tokenizer, [{"role": "user", "content": "x"}], None, open_thinking)
            self.openers.append(ids[len(ids) - ids[::-1].index(tokenizer.eos_token_id):])

    def _target(self, row_ids):
        row_ids = [t for t in row_ids if t != self.tokenizer.pad_token_id]
        text = self.tokenizer.decode(row_ids)
        key = next((k for k in self.scripts if k in text), None)
        eos = self.tokenizer.eos_token_id
        turn = (row_ids.count(eos) - 2) // 2
        if key is None or turn >= len(self.scripts[key]):
            return None
        after = row_ids[len(row_ids) - row_ids[::-1].index(eos):]
        opener = next(o for o in self.openers if after[:len(o)] == o)
        ids = self.tokenizer(self.scripts[key][turn], add_special_tokens=False)["input_ids"]
        return (ids + [eos])[len(after) - len(opener):]

    def __call__(self, input_ids, scores):
        if self.start is None:
            self.start = input_ids.shape[1]
            self.targets = [self._target(row) for row in input_ids.tolist()]
        step = input_ids.shape[1] - self.start
        for row, target in enumerate(self.targets):
            if target is not None:
                token = target[min(step, len(target) - 1)]
                scores[row] = float("-inf")
                scores[row, token] = 0.0
        return scores

def scripted(model, tokenizer, scripts=SCRIPTS):
    """Make ``model.generate`` follow ``scripts`` (an instance attribute shadows the method)."""
    generate = model.generate

    def forced_generate(*args, logits_processor=None, **kwargs):
        processors = LogitsProcessorList([*(logits_processor or []), ScriptedReplies(tokenizer, scripts)])
        return generate(*args, logits_processor=processors, **kwargs)

    model.generate = forced_generate
    return model


def count_generate_calls(model):
    """Make ``model.generate`` append each call's batch size to the returned list."""
    calls = []
    generate = model.generate

    def counted(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return generate(*args, **kwargs)

    model.generate = counted
    return calls


def make_task(registry, question, task_id):
    tools = json.dumps(registry.schemas(["calculate_math"]), ensure_ascii=False)
    return {"id": task_id, "gt": ["21"], "conversations": [
        {"role": "system", "content": "You are a calculator.", "tools": tools},
        {"role": "user", "content": question},
        {"role": "assistant", "content": ""}]}


def scripted_rows(registry, keys):
    """GRPO dataset rows of one calculator task per script key (``"[think]"`` opens thinking)."""
    rows = []
    for i, key in enumerate(keys):
        task = make_task(registry, f"{key} compute it", f"t{i}")
        rows.append({"prompt": task["conversations"][:-1], "gt": ["21"], "id": key,
                     "open_thinking": key == "[think]"})
    return rows


def independent_rendering(tokenizer, task, turns, observations, open_thinking=False):
    """Independent rendering of a finished rollout: the task's messages, each model turn as an
    assistant message with its raw text as content, each tool round as tool messages. Returns
    (ids, assistant mask) of the whole conversation from the template's generation markers."""
    messages, tools = task_prompt(task)
    for k, text in enumerate(turns):
        messages.append({"role": "assistant", "content": text})
        messages += [{"role": "tool", "content": o} for o in observations[k]]
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True, open_thinking=open_thinking)
    return list(out["input_ids"]), list(out["assistant_masks"])
