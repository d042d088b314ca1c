"""The fixed low end of the MiniMind vocabulary: special, reserved and added tokens.

Ids 0-26 are as in upstream MiniMind (checked against the token ids in the golden chat renderings):
0 ``<|endoftext|>`` (pad and unk), 1 ``<|im_start|>`` (bos), 2 ``<|im_end|>`` (eos), 3-20 reserved,
21-26 the tool and think tags. The tags are added tokens but *not* special, so they survive
``decode(..., skip_special_tokens=True)``.

Upstream's first byte token sits at id 36 (``!`` = 36, ``+`` = 46, ``1`` = 52, ``\\n`` = 234 in the
goldens), so ids 27-35 are taken by tokens the goldens do not reveal. We reserve them too: then the
256 byte-level tokens get exactly upstream's ids 36-291 and BPE merges start at 292.
"""

from __future__ import annotations

PAD_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

#: Added tokens that must stay visible in decoded text (not special), at ids 21-26.
ADDED_TOKENS: tuple[str, ...] = (
    TOOL_CALL_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_RESPONSE_OPEN,
    TOOL_RESPONSE_CLOSE,
    THINK_OPEN,
    THINK_CLOSE,
)
FIRST_ADDED_ID = 21
FIRST_BYTE_ID = 36
NUM_BYTE_TOKENS = 256


def reserved_token(token_id: int) -> str:
    """Name of the reserved (unused, special) token at ``token_id``."""
    return f"<|reserved_{token_id}|>"


def fixed_tokens() -> list[str]:
    """Tokens at ids 0..35, in id order."""
    tokens = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]
    tokens += [reserved_token(i) for i in range(3, FIRST_ADDED_ID)]
    tokens += list(ADDED_TOKENS)
    tokens += [reserved_token(i) for i in range(FIRST_ADDED_ID + len(ADDED_TOKENS), FIRST_BYTE_ID)]
    assert len(tokens) == FIRST_BYTE_ID
    return tokens


#: The ids every MiniMind tokenizer must agree on (checked when loading a user-supplied folder).
REQUIRED_IDS: dict[str, int] = {PAD_TOKEN: 0, BOS_TOKEN: 1, EOS_TOKEN: 2}

#: Smallest vocabulary that holds the fixed tokens and all 256 bytes.
MIN_VOCAB_SIZE = FIRST_BYTE_ID + NUM_BYTE_TOKENS
