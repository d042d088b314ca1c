"""E0 stage: pretraining and supervised fine-tuning of MiniMind with TRL's ``SFTTrainer``.

Two modes, both handed to ``SFTTrainer`` as pre-tokenized datasets (an ``input_ids`` column, so
TRL skips its own rendering and tokenization):

``mode="sft"`` -- rows in the upstream SFT schema ``{"conversations": [...]}`` (tools as a JSON
string on the system turn, ``tool_calls`` as JSON strings, tool results as role ``tool``). Each row
is converted with :func:`minimind_trl.data.row_messages`, rendered once by the chat
template and tokenized once. The loss mask is then read off the token ids alone: every occurrence
of the ids of ``<|im_start|>assistant\\n`` opens a span that runs through the next ``<|im_end|>``
(the eos id) inclusive; the ``\\n`` after it and every system, user and tool token stay out. The
span includes the think block (``<think>\\n\\n</think>\\n\\n`` when there is no reasoning), so the
model learns the whole turn whichever generation prompt (``open_thinking`` or not) it later sees;
the rendering of a full conversation does not depend on ``open_thinking``. The number of spans
found must equal the number of assistant turns, else the row is rejected (a header merged with a
neighbouring token would silently drop a turn). The mask goes into an ``assistant_masks`` column,
from which ``SFTTrainer`` builds ``labels`` (-100 where the mask is 0). Upstream MiniMind's SFT
data also trains the ``\n`` after ``<|im_end|>``; we stop at ``<|im_end|>``, where generation ends.

Over-long conversations are *dropped*, not truncated: a cut tool trajectory would teach a tool call
with no answer or an answer with no evidence. Their number is reported in :class:`SFTDataStats`
(and logged). An assistant turn with no content, reasoning or tool call (the placeholder of
agent-RL task rows) is an error: such rows are prompts, not demonstrations.

``mode="pretrain"`` -- rows ``{"text": str}``, as upstream MiniMind's pretraining data:
``<|im_start|>`` + text tokens + ``<|im_end|>``, the text cut to ``max_length - 2`` tokens so the
eos always closes the sequence, and the loss on every token (``labels`` = ``input_ids``; padding
is -100). Truncating plain text is harmless; truncated rows are counted. With ``pack=True`` the
texts are not cut: every ``<|im_start|>`` + text + ``<|im_end|>`` sequence is concatenated, in row
order, into one stream that is cut into blocks of exactly ``max_length`` tokens (the incomplete last
block is dropped), as GPT-style pretraining does. A block may start inside a text and hold several;
attention is not reset at text boundaries. Short texts then cost no padding, and every optimizer
step sees the same number of tokens.

:class:`MiniMindSFTTrainer` is ``SFTTrainer`` with MiniMind's own MoE load-balancing loss (TRL's
fused LM head would add Mixtral's); dense models train exactly as with ``SFTTrainer``. A recipe of
kind ``sft`` (``trainer.kinds``) builds its config and trainer from these pieces; there is no
second, programmatic entry point.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerBase
from trl import SFTTrainer

from minimind_trl.conversation import is_placeholder
from minimind_trl.data import row_messages
from minimind_trl.modeling.aux_loss import use_minimind_aux_loss

logger = logging.getLogger(__name__)

ASSISTANT_HEADER = "<|im_start|>assistant\n"
MODES = ("sft", "pretrain")


@dataclass(frozen=True)
class SFTDataStats:
    """What :func:`build_sft_dataset` kept, dropped and trains on."""

    mode: str
    rows: int
    kept: int
    dropped_overlong: int  # sft: rows longer than max_length, left out
    truncated: int  # pretrain: rows whose text was cut to fit
    longest: int  # longest tokenized row before dropping / truncation
    tokens: int  # tokens in the kept rows
    loss_tokens: int  # of those, tokens predicted with a loss (a row's first token never is)
    packed: bool = False  # pretrain: rows are max_length blocks of the concatenated texts


def assistant_token_mask(input_ids: list[int], header_ids: list[int], end_id: int) -> tuple[list[int], int]:
    """1 on each span after ``header_ids`` through the next ``end_id`` inclusive, else 0.

    Returns ``(mask, number_of_spans)``. A header with no ``end_id`` after it raises ``ValueError``.
    """
    mask = [0] * len(input_ids)
    width, spans, i = len(header_ids), 0, 0
    while i + width <= len(input_ids):
        if input_ids[i : i + width] != header_ids:
            i += 1
            continue
        start = end = i + width
        while end < len(input_ids) and input_ids[end] != end_id:
            end += 1
        if end == len(input_ids):
            raise ValueError(f"assistant turn opened at token {i} has no end token {end_id}")
        mask[start : end + 1] = [1] * (end + 1 - start)
        spans += 1
        i = end + 1
    return mask, spans


def tokenize_conversation(
    conversations: list[dict], tokenizer: PreTrainedTokenizerBase, where: str = "row"
) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of one upstream-schema conversation, rendered once."""
    messages, tools = row_messages(conversations)
    assistants = [m for m in messages if m["role"] == "assistant"]
    if not assistants:
        raise ValueError(f"{where}: no assistant turn, nothing to learn")
    if any(is_placeholder(m) for m in assistants):
        raise ValueError(f"{where}: an assistant turn has no content, reasoning or tool call (a task prompt?)")
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    input_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    header_ids = tokenizer(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    mask, spans = assistant_token_mask(input_ids, header_ids, tokenizer.eos_token_id)
    if spans != len(assistants):
        raise ValueError(
            f"{where}: found {spans} assistant spans in the token ids for {len(assistants)} assistant turns"
        )
    return input_ids, mask


def tokenize_pretrain_text(text: str, tokenizer: PreTrainedTokenizerBase, max_length: int) -> tuple[list[int], int]:
    """``(bos + text tokens + eos, full length)``, the text cut to ``max_length - 2`` tokens.

    The full length is that of the uncut sequence; it exceeds ``len(ids)`` when the text was cut.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids[: max_length - 2], tokenizer.eos_token_id], len(ids) + 2


def _field(row: Mapping[str, Any], name: str, index: int, mode: str) -> Any:
    if name not in row:
        raise ValueError(f"row {index}: mode {mode!r} needs a {name!r} field, got {sorted(row)}")
    return row[name]


def pack_sequences(sequences: list[list[int]], block: int) -> list[list[int]]:
    """``sequences`` concatenated in order and cut into blocks of exactly ``block`` ids; the
    incomplete tail is dropped."""
    stream = [token for sequence in sequences for token in sequence]
    return [stream[start:start + block] for start in range(0, len(stream) - block + 1, block)]


def build_sft_dataset(
    rows: Iterable[Mapping[str, Any]], tokenizer: PreTrainedTokenizerBase, max_length: int, mode: str = "sft",
    pack: bool = False,
) -> tuple[Dataset, SFTDataStats]:
    """The pre-tokenized dataset for ``SFTTrainer`` and its :class:`SFTDataStats`.

    ``sft``: columns ``input_ids`` and ``assistant_masks``; rows over ``max_length`` tokens are
    dropped (and logged). ``pretrain``: column ``input_ids``, loss on every token; long texts are
    truncated, or with ``pack`` every text is kept whole and the concatenation is cut into
    ``max_length`` blocks (module docstring). Raises ``ValueError`` on a malformed row, on ``pack``
    outside pretrain mode, or when no row (block) is left.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3, got {max_length}")
    if pack and mode != "pretrain":
        raise ValueError("pack=True is for mode 'pretrain' only: SFT rows keep their own loss masks")
    input_ids: list[list[int]] = []
    masks: list[list[int]] = []
    seen = dropped = truncated = longest = 0
    for index, row in enumerate(rows):
        seen += 1
        if mode == "pretrain":
            text = _field(row, "text", index, mode)
            if not isinstance(text, str):
                raise ValueError(f"row {index}: 'text' must be a string, got {type(text).__name__}")
            # Packed texts are never cut: the block boundaries fall wherever they fall.
            ids, full_length = tokenize_pretrain_text(text, tokenizer, sys.maxsize if pack else max_length)
            longest, truncated = max(longest, full_length), truncated + (full_length > len(ids))
            input_ids.append(ids)
            masks.append([1] * len(ids))
            continue
        conversations = _field(row, "conversations", index, mode)
        ids, mask = tokenize_conversation(conversations, tokenizer, where=f"row {index}")
        longest = max(longest, len(ids))
        if len(ids) > max_length:
            dropped += 1
            continue
        input_ids.append(ids)
        masks.append(mask)
    if pack:
        texts = len(input_ids)
        input_ids = pack_sequences(input_ids, max_length)
        masks = [[1] * max_length for _ in input_ids]
        if not input_ids:
            raise ValueError(f"{texts} texts hold fewer than max_length={max_length} tokens: nothing to pack")
    if dropped:
        logger.warning("build_sft_dataset: dropped %d of %d rows longer than max_length=%d", dropped, seen, max_length)
    if not input_ids:
        raise ValueError(f"no rows left to train on ({seen} rows, {dropped} longer than max_length={max_length})")
    stats = SFTDataStats(
        mode=mode, rows=seen, kept=len(input_ids), dropped_overlong=dropped, truncated=truncated, longest=longest,
        tokens=sum(map(len, input_ids)), loss_tokens=sum(sum(mask[1:]) for mask in masks), packed=pack,
    )
    columns = {"input_ids": input_ids} if mode == "pretrain" else {"input_ids": input_ids, "assistant_masks": masks}
    return Dataset.from_dict(columns), stats


class MiniMindSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose MoE load-balancing loss is MiniMind's.

    TRL 1.16 replaces the model's forward with a fused LM head that, for MoE models, computes
    Mixtral's ``load_balancing_loss_func`` (one average over the routed tokens of all layers) and
    returns it as ``aux_loss``; ``compute_loss`` adds ``router_aux_loss_coef * aux_loss`` and logs
    it. MiniMind's loss is ``router_aux_loss`` (``E * sum_e load_e * P_e`` per layer, summed over
    layers; `minimind_trl.modeling`), the one its own forward and our GRPO trainer use. The fused
    forward is wrapped so that ``aux_loss`` is ours, from the same forward's router logits: the
    SFT loss is then ``CE + coef * router_aux_loss``, as upstream's trainer computes it."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        if getattr(model.config, "use_moe", False):
            use_minimind_aux_loss(model)
