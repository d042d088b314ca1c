"""Train a MiniMind byte-level BPE tokenizer from corpus files and save it as a standard folder.

The result loads with ``AutoTokenizer.from_pretrained`` / ``PreTrainedTokenizerFast`` and carries
the chat template and response template. Layout: ids 0-35 fixed (see :mod:`.vocab`), the 256
byte tokens at 36-291 (so any text round-trips), BPE merges above. No prefix space, no automatic
bos/eos. Before byte-level pre-tokenization, digits are split one per token (numbers are copied
from tool results digit by digit, and no vocabulary goes to random numbers) and every newline is
its own token. The latter keeps prompts token-consistent: the generation prompt ends in
``</think>\n\n``, and a merged ``\n\n`` token at the end of a prompt would differ from the
``\n`` ``\n`` the same text gets when the assistant turn follows (the byte-level regex splits
whitespace differently before a word), so SFT renderings and RL prompts would disagree.

Corpus files: ``.jsonl`` rows with ``text`` (pretrain format) or ``conversations`` (SFT format,
rendered through the chat template, so the tokenizer learns the template's pieces); any other
file is read as plain UTF-8 text. BPE training is deterministic for a given corpus, so the same
files and settings give a byte-identical ``tokenizer.json``. ``seed`` picks which documents are
kept when ``max_documents`` caps the corpus.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

from minimind_trl.conversation import normalize_conversation
from minimind_trl.tokenization.loading import load_tokenizer
from minimind_trl.tokenization.template import CHAT_TEMPLATE, RESPONSE_TEMPLATE
from minimind_trl.tokenization.vocab import (
    ADDED_TOKENS,
    BOS_TOKEN,
    EOS_TOKEN,
    FIRST_BYTE_ID,
    MIN_VOCAB_SIZE,
    PAD_TOKEN,
    fixed_tokens,
)

MODEL_MAX_LENGTH = 32768
BUILD_INFO_FILE = "build_info.json"
_TEXT_CHUNK_LINES = 2000


def render_conversation(conversations: list[dict], where: str = "conversations") -> str:
    """Render an upstream-format conversation (no generation prompt) with the chat template."""
    messages, tools = normalize_conversation(conversations, where)
    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=CHAT_TEMPLATE)
    return rendered[0]


def _jsonl_documents(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
            if isinstance(row, dict) and isinstance(row.get("text"), str):
                yield row["text"]
            elif isinstance(row, dict) and "conversations" in row:
                yield render_conversation(row["conversations"], f"{where}: conversations")
            else:
                raise ValueError(f"{where}: a corpus row needs a string 'text' or a 'conversations' list")


def _text_documents(path: Path) -> Iterator[str]:
    chunk: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            chunk.append(line)
            if len(chunk) >= _TEXT_CHUNK_LINES:
                yield "".join(chunk)
                chunk = []
    if chunk:
        yield "".join(chunk)


def _stream(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        reader = _jsonl_documents if path.suffix == ".jsonl" else _text_documents
        try:
            yield from (doc for doc in reader(path) if doc)
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def iter_corpus(corpus_files: Iterable[str | Path]) -> Iterator[str]:
    """The documents of the corpus files, in file order, streamed. Missing files fail at once;
    errors in a file's content (raised while streaming) name the file and line."""
    paths = [Path(name) for name in corpus_files]
    if not paths:
        raise ValueError("no corpus files given")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
    return _stream(paths)


class _Counted:
    """Iterates ``items`` once, counting them."""

    def __init__(self, items: Iterable[str]):
        self.items, self.count = items, 0

    def __iter__(self) -> Iterator[str]:
        for item in self.items:
            self.count += 1
            yield item


_FIXED_TOKEN_RE = re.compile("|".join(re.escape(t) for t in fixed_tokens()))


def _segments(documents: Iterable[str]) -> Iterator[str]:
    """The text between fixed tokens, as encoding will see it (the tokens themselves are whole
    ids, so BPE should neither learn merges inside them nor across them)."""
    for document in documents:
        yield from (piece for piece in _FIXED_TOKEN_RE.split(document) if piece)


def train_bpe(documents: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train the raw ``tokenizers`` BPE with the MiniMind fixed tokens; exactly ``vocab_size`` ids."""
    if vocab_size < MIN_VOCAB_SIZE + 1:
        raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE + 1} (36 fixed tokens + 256 bytes + merges)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split("\n", behavior="isolated"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        special_tokens=fixed_tokens(),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    segments = _Counted(_segments(documents))
    tokenizer.train_from_iterator(segments, trainer=trainer)
    if segments.count == 0:
        raise ValueError("the corpus is empty: it holds no text")
    if tokenizer.get_vocab_size() != vocab_size:
        raise ValueError(
            f"the corpus is too small to learn {vocab_size} tokens (BPE ran out of merges at "
            f"{tokenizer.get_vocab_size()}); add text or lower vocab_size"
        )
    # The tool/think tags are added tokens but not special: they must survive skip_special_tokens.
    spec = json.loads(tokenizer.to_str())
    for entry in spec["added_tokens"]:
        entry["normalized"] = False
        entry["special"] = entry["content"] not in ADDED_TOKENS
    tokenizer = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    first_byte = pre_tokenizers.ByteLevel.alphabet()
    if tokenizer.token_to_id(min(first_byte)) != FIRST_BYTE_ID:
        raise RuntimeError("unexpected layout: the byte tokens do not start at id 36")
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers tokenizer around a trained MiniMind ``Tokenizer``, template included."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        response_template=RESPONSE_TEMPLATE,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_tokenizer(
    corpus_files: list[str],
    output_dir: str,
    vocab_size: int = 6400,
    seed: int = 42,
    *,
    max_documents: int | None = None,
    overwrite: bool = False,
    provenance: dict | None = None,
) -> PreTrainedTokenizerFast:
    """Train on ``corpus_files`` and save the tokenizer folder to ``output_dir``; returns it loaded.

    ``max_documents`` keeps a seeded random sample of that many documents (``seed`` matters only
    then). Refuses a non-empty ``output_dir`` unless ``overwrite``. Besides the tokenizer files it
    writes ``build_info.json`` (settings, corpus hashes and the optional ``provenance`` dict, e.g.
    how the corpus was made) for auditing.
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"output_dir is a file: {out}")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"output_dir is not empty: {out} (choose an empty or new folder)")
    files = [Path(f) for f in corpus_files]
    documents: Iterable[str] = iter_corpus(files)
    num_read = None
    if max_documents is not None:
        if max_documents < 1:
            raise ValueError(f"max_documents must be positive, got {max_documents}")
        documents = list(documents)
        num_read = len(documents)
        if max_documents < num_read:
            keep = sorted(random.Random(seed).sample(range(num_read), max_documents))
            documents = [documents[i] for i in keep]
    counted = _Counted(documents)
    trained = train_bpe(counted, vocab_size)
    num_read = counted.count if num_read is None else num_read
    tokenizer = wrap_tokenizer(trained)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out))
    info = {
        "vocab_size": vocab_size,
        "seed": seed,
        "max_documents": max_documents,
        "documents_read": num_read,
        "documents_used": counted.count,
        "corpus": [{"name": f.name, "bytes": f.stat().st_size, "sha256": _sha256(f)} for f in files],
        "tokenizers_version": tokenizers.__version__,
    }
    if provenance:
        info["provenance"] = provenance
    (out / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return load_tokenizer(str(out))
