"""A reward from a local sequence-classification reward model.

`make_reward_model_reward(path)` loads ``AutoModelForSequenceClassification`` and its tokenizer
from a local folder and returns a TRL reward function whose value for a completion is the
model's first logit on

    chat_template([{"role": "user", "content": question}, {"role": "assistant", "content": answer}])

(or ``question + "\\n" + answer`` when the tokenizer has no chat template), where ``question`` is
the last user message of the prompt (the whole prompt if it is a string) and ``answer`` the
completion's final answer (`final_answer_text`: after the last tool result, without think and
tool-call blocks). Texts are truncated to ``max_length`` tokens from the left so the answer
survives. Scoring runs without gradients, in batches when the tokenizer has a pad token (else
one text at a time, since the model finds each sequence's last token through the pad id).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from minimind_trl.rewards.rewards import RewardFunction
from minimind_trl.rewards.trajectory import view_completion


def render_for_reward_model(tokenizer, question: str, answer: str) -> str:
    """The text a reward model scores (module docstring): the one rendering the scorer and the
    ``reward`` recipe kind, which trains reward models, share."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return f"{question}\n{answer}"


def prompt_question(prompt) -> str:
    """The question a reward model sees: the last user message (the whole prompt if a string)."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt or [] if m.get("role") == "user"]
    content = users[-1] if users else ""
    return content if isinstance(content, str) else str(content)


class RewardModelScorer:
    """Loads a reward model folder once; `score(questions, answers)` returns one float each."""

    def __init__(self, path: str, device: str | None = None, max_length: int = 1024,
                 batch_size: int = 8):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.truncation_side = "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(self.device)
        self.model.eval().requires_grad_(False)
        self.max_length, self.batch_size = max_length, batch_size
        if self.tokenizer.pad_token_id is not None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def render(self, question: str, answer: str) -> str:
        return render_for_reward_model(self.tokenizer, question, answer)

    def score(self, questions: list[str], answers: list[str]) -> list[float]:
        texts = [self.render(q, a) for q, a in zip(questions, answers)]
        step = self.batch_size if self.tokenizer.pad_token_id is not None else 1
        scores: list[float] = []
        for start in range(0, len(texts), step):
            batch = self.tokenizer(texts[start:start + step], return_tensors="pt",
                                   padding=step > 1, truncation=True, max_length=self.max_length,
                                   add_special_tokens=False).to(self.device)
            with torch.no_grad():
                logits = self.model(**batch).logits
            scores.extend(logits[:, 0].float().cpu().tolist())
        return scores


def reward_model_folder_problem(path) -> str | None:
    """Why ``path`` is not a local reward-model folder (None: it is one). Checked before any model
    is built: a missing folder must not be read as a Hub id (no network at run time)."""
    if not isinstance(path, str) or not path:
        return f"must be the path of a local reward-model folder, got {path!r}"
    folder = Path(path)
    if not folder.is_dir():
        return (f"{path} is not a folder: point it at a local AutoModelForSequenceClassification folder "
                "(--set rewards.0.options.path=DIR), e.g. the final/ of a run of recipes/e4/reward_model.yaml; "
                "a missing folder is never looked up on the Hub")
    if not (folder / "config.json").is_file():
        return f"{path} holds no config.json: not a model folder (a run folder's model is in its final/)"
    return None


def make_reward_model_reward(path: str, device: str | None = None, max_length: int = 1024,
                             batch_size: int = 8, name: str = "reward_model_reward"
                             ) -> RewardFunction:
    """TRL reward function scoring each completion's final answer with a local reward model."""
    problem = reward_model_folder_problem(path)
    if problem is not None:
        raise ValueError(f"reward_model path: {problem}")
    scorer = RewardModelScorer(path, device=device, max_length=max_length, batch_size=batch_size)

    def reward(prompts, completions, **kwargs) -> list[float]:
        answers = [view_completion(c).final_answer for c in completions]
        return scorer.score([prompt_question(p) for p in prompts], answers)

    reward.__name__ = reward.__qualname__ = name
    reward.scorer = scorer
    return reward
