"""Shared test set-up: offline Hugging Face, a private HF_HOME, few threads, reference data path, and the
shared fixtures: ``tiny_model`` / ``make_tiny_model`` (seeded tiny presets), ``tokenizer`` (the packaged
one), ``registry`` (the built-in tools), ``split_dir`` (a small audited split folder)."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

# Must happen before any Hugging Face import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "HF_HOME" not in os.environ:
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="minimind-trl-hf-home-")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from minimind_trl.data.generator import generate_tasks  # noqa: E402
from minimind_trl.data.splits import prepare_splits  # noqa: E402
from minimind_trl.envs.tools import ToolRegistry, default_registry  # noqa: E402
from minimind_trl.fsio import write_jsonl_atomic  # noqa: E402
from minimind_trl.modeling import MiniMindForCausalLM, get_preset  # noqa: E402
from minimind_trl.tokenization import load_tokenizer  # noqa: E402

# One thread: tiny test models are faster single-threaded, and OpenMP barriers make 2 threads
# crawl when anything else shares the cores.
torch.set_num_threads(1)

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = REPO_ROOT.parent / "shared" / "minimind_reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The upstream golden data (`../shared/minimind_reference`); skips when absent."""
    if not (REFERENCE_DIR / "models.json").is_file():
        pytest.skip(f"reference data not found at {REFERENCE_DIR}")
    return REFERENCE_DIR


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory) -> Path:
    """A small audited split folder (12 generated tasks: 8 / 2 / 2); test modules may define their own."""
    root = tmp_path_factory.mktemp("data")
    write_jsonl_atomic(root / "tasks.jsonl", generate_tasks(12, seed=3))
    prepare_splits([root / "tasks.jsonl"], root / "splits", seed=3, sizes=[8, 2, 2])
    return root / "splits"


def build_tiny_model(moe: bool = False, seed: int = 0, **config_overrides) -> MiniMindForCausalLM:
    """A fresh preset "tiny" (or "tiny-moe") model, weights drawn after ``torch.manual_seed(seed)``, in
    eval mode (call ``.train()`` to train it). Overrides go to ``get_preset``."""
    torch.manual_seed(seed)
    return MiniMindForCausalLM(get_preset("tiny-moe" if moe else "tiny", **config_overrides)).eval()


@pytest.fixture
def make_tiny_model():
    """The factory ``build_tiny_model(moe=False, seed=0, **config_overrides)``: one fresh model per call."""
    return build_tiny_model


@pytest.fixture
def tiny_model() -> MiniMindForCausalLM:
    """A fresh dense tiny model (seed 0, eval mode); each test gets its own."""
    return build_tiny_model()


@pytest.fixture(scope="session")
def tokenizer():
    """The packaged tokenizer (`load_tokenizer()`), shared by the session: read it, do not change it
    (a test that changes a tokenizer loads its own)."""
    return load_tokenizer()


@pytest.fixture
def registry() -> ToolRegistry:
    """A fresh registry of the built-in tools (`default_registry()`); a test may register more."""
    return default_registry()
