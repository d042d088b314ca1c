"""Moved: the default tokenizer's corpus is `minimind_trl.data.tokenizer_corpus`.

This module only re-exports its names for `minimind_trl/demo.py` until that importer moves.
"""

# re-export: importers move in the final pass
from minimind_trl.data.tokenizer_corpus import (  # noqa: F401
    GENERAL_TEXT_FILE,
    default_corpus,
    general_text,
    task_documents,
)
