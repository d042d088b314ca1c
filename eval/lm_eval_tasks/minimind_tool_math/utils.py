"""lm-evaluation-harness hooks for the MiniMind tool-math splits (README: "Use with other tools").

lm-eval's `generate_until` runs ONE model turn and executes no tools, so the two tasks ask for the
one turn that needs none:

* `minimind_tool_math_direct`: the question alone (no system prompt, no tools); the model answers
  directly. A tool-free baseline: exchange rates, weather and similar questions are unanswerable.
* `minimind_tool_math_final`: the gold tool calls and their real observations are already in the
  prompt (replayed through our tool registry); the model writes the final answer. Needs generated
  task rows (`meta.calls`), e.g. `minimind-trl data generate` + `data prepare` splits.

Both render prompts with our chat template and score the generated text with the project's
verifier (`minimind_trl.rewards.evaluate_completion`, the training reward's check).
The full multi-turn protocol with tool execution is `eval/tool_math.py` / `minimind-trl eval`.
"""

from __future__ import annotations

from functools import lru_cache

from minimind_trl.conversation import normalize_conversation
from minimind_trl.data.gold import gold_trajectory
from minimind_trl.envs.tools import default_registry
from minimind_trl.rewards import evaluate_completion, prompt_question
from minimind_trl.tokenization import load_tokenizer


@lru_cache(maxsize=1)
def _tokenizer():
    return load_tokenizer()  # the packaged tokenizer: any MiniMind tokenizer renders our template


@lru_cache(maxsize=1)
def _registry():
    return default_registry()


def question(doc: dict) -> str:
    return prompt_question(doc.get("conversations") or [])


def doc_to_text_direct(doc: dict) -> str:
    """`<|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`"""
    messages = [{"role": "user", "content": question(doc)}]
    return _tokenizer().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def doc_to_text_final(doc: dict) -> str:
    """System + tools, question, the gold tool turns with observations, then the generation prompt."""
    conversation = gold_trajectory(doc, _registry())["conversations"][:-1]  # all but the final answer
    messages, tools = normalize_conversation(conversation)
    return _tokenizer().apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def doc_to_target(doc: dict) -> str:
    return ", ".join(str(value) for value in doc["gt"])


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """Verifier scores of the generated turn `results[0]`: success (every GT value stated in the
    final answer, strict) and the fraction of GT values stated; the question tells the verifier
    whether the task asks for a percentage."""
    _, verification = evaluate_completion(results[0], list(doc["gt"]), question=question(doc))
    return {"task_success": float(verification.success), "gt_coverage": float(verification.gt_coverage)}
