"""Load a MiniMind tokenizer folder (ours, the shipped default, or an upstream MiniMind one), and
choose it: :func:`resolve_tokenizer_folder` is the one rule for which tokenizer goes with a model.

Which tokenizer: a model folder that holds a tokenizer (``tokenizer.json``) brings its own, and it
is the default wherever that folder is the start (train, eval, export, sweep); an explicit
tokenizer whose tokenization model (vocabulary ids and merges) differs from the folder's is
refused, naming both, unless the caller opts in. Upstream MiniMind weights come with upstream's
tokenizer: with another one the ids are silently wrong and every run looks collapsed.

Whatever the folder, the returned tokenizer carries *our* chat template and response template, so
renderings and TRL's tool parsing are identical across tokenizers; the folder's own template is
replaced. The special ids must be MiniMind's (0 pad/unk, 1 bos, 2 eos), else loading fails.
"""

from __future__ import annotations

import json
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


class TokenizerMismatchError(ValueError):
    """An explicit tokenizer whose tokenization model differs from the model folder's own."""


def tokenizer_folder_of(model_path: str | Path | None) -> Path | None:
    """``model_path`` when it is a folder holding a ``tokenizer.json``, else None."""
    if model_path is None:
        return None
    folder = Path(model_path)
    return folder if (folder / "tokenizer.json").is_file() else None


def tokenization_model(folder: str | Path) -> dict:
    """The ``model`` section (vocabulary ids, merges) and added tokens of ``folder/tokenizer.json``:
    what decides which ids a text becomes."""
    spec = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
    added = sorted((t.get("id"), t.get("content")) for t in spec.get("added_tokens") or [])
    return {"model": spec.get("model"), "added_tokens": added}


def resolve_tokenizer_folder(model_path: str | Path | None, explicit: str | Path | None,
                             allow_mismatch: bool = False) -> Path | None:
    """The tokenizer folder to use with the model at ``model_path`` (None: the packaged one).

    ``explicit`` None: the model folder's own tokenizer when it has one, else the packaged one.
    ``explicit`` given: used, but when the model folder has its own tokenizer and the two differ
    in :func:`tokenization_model`, :class:`TokenizerMismatchError` names both unless
    ``allow_mismatch``."""
    own = tokenizer_folder_of(model_path)
    if explicit is None:
        return own
    explicit = Path(explicit)
    if own is not None and not allow_mismatch and (explicit / "tokenizer.json").is_file() \
            and tokenization_model(own) != tokenization_model(explicit):
        raise TokenizerMismatchError(
            f"tokenizer {explicit} differs from the tokenizer of the model folder {own} (other token ids or "
            f"merges): the model would read wrong ids. Leave the tokenizer unset to use the model's own, or opt "
            f"in explicitly (recipe: tokenizer.allow_mismatch: true; eval/export: --allow-tokenizer-mismatch)")
    return explicit
