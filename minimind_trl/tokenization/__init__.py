"""MiniMind tokenizer: byte-level BPE building, the chat template and loading.

Public API: :func:`load_tokenizer`, :func:`build_tokenizer`, :func:`normalize_conversation`,
:func:`render_conversation`, :data:`CHAT_TEMPLATE`, :data:`RESPONSE_TEMPLATE`,
:data:`DEFAULT_TOKENIZER_DIR`. Token layout constants live in :mod:`.vocab`.
"""

from minimind_trl.conversation import normalize_conversation
from minimind_trl.tokenization.builder import build_tokenizer, render_conversation
from minimind_trl.tokenization.loading import DEFAULT_TOKENIZER_DIR, load_tokenizer
from minimind_trl.tokenization.template import CHAT_TEMPLATE, RESPONSE_TEMPLATE

__all__ = [
    "CHAT_TEMPLATE",
    "DEFAULT_TOKENIZER_DIR",
    "RESPONSE_TEMPLATE",
    "build_tokenizer",
    "load_tokenizer",
    "normalize_conversation",
    "render_conversation",
]
