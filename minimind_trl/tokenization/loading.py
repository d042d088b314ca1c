"""Load a MiniMind tokenizer folder (ours, the shipped default, or an upstream MiniMind one).

Whatever the folder, the returned tokenizer carries *our* chat template and response template, so
renderings and TRL's tool parsing are identical across tokenizers; the folder's own template is
replaced. The special ids must be MiniMind's (0 pad/unk, 1 bos, 2 eos), else loading fails.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from minimind_trl.tokenization.template import CHAT_TEMPLATE, RESPONSE_TEMPLATE
from minimind_trl.tokenization.vocab import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, REQUIRED_IDS

DEFAULT_TOKENIZER_DIR = Path(str(resources.files(__package__).joinpath("default")))


def load_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Load the tokenizer folder at ``path`` (default: the tokenizer shipped in the package).

    The folder needs a ``tokenizer.json``. Sets the chat template, ``response_template`` (for TRL
    tool parsing) and the pad/unk/bos/eos tokens; raises ``ValueError`` naming the folder when
    ``<|endoftext|>``, ``<|im_start|>`` or ``<|im_end|>`` are not at ids 0, 1, 2.
    """
    folder = DEFAULT_TOKENIZER_DIR if path is None else Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"tokenizer folder not found: {folder}")
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}: no tokenizer.json (a MiniMind tokenizer folder needs one)")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    vocab = tokenizer.get_vocab()
    for token, expected in REQUIRED_IDS.items():
        actual = vocab.get(token)
        if actual != expected:
            raise ValueError(
                f"{folder}/tokenizer.json: {token} has id {actual} (None: missing), "
                f"a MiniMind tokenizer needs id {expected}"
            )
    tokenizer.pad_token, tokenizer.unk_token = PAD_TOKEN, PAD_TOKEN
    tokenizer.bos_token, tokenizer.eos_token = BOS_TOKEN, EOS_TOKEN
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer
