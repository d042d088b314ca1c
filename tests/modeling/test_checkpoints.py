"""Checkpoint resolution and SHA256 for evaluation manifests."""

import hashlib

import pytest

from minimind_trl.modeling.checkpoints import CheckpointError, CheckpointNotFoundError, resolve_checkpoint


def test_single_weight_file_hash_is_file_sha(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"weights-1")
    (tmp_path / "tokenizer.json").write_text("{}")  # not a weight file
    info = resolve_checkpoint(tmp_path)
    assert info.kind == "hub"
    assert info.sha256 == hashlib.sha256(b"weights-1").hexdigest()
    assert list(info.to_dict()["weight_files"]) == ["model.safetensors"]


def test_sharded_hash_is_sha_of_sorted_listing(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"b")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"a")
    info = resolve_checkpoint(tmp_path)
    sa, sb = hashlib.sha256(b"a").hexdigest(), hashlib.sha256(b"b").hexdigest()
    listing = f"{sa}  model-00001-of-00002.safetensors\n{sb}  model-00002-of-00002.safetensors\n"
    assert info.sha256 == hashlib.sha256(listing.encode()).hexdigest()


def test_native_pth_needs_preset(tmp_path):
    pth = tmp_path / "full_sft_768.pth"
    pth.write_bytes(b"not really torch")
    with pytest.raises(CheckpointError, match="--preset"):
        resolve_checkpoint(pth)
    info = resolve_checkpoint(pth, preset="minimind-3")
    assert info.kind == "native" and info.sha256 == hashlib.sha256(b"not really torch").hexdigest()


def test_missing_or_empty_checkpoints(tmp_path):
    with pytest.raises(CheckpointNotFoundError, match="not found"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointNotFoundError, match="config.json"):
        resolve_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="no weights"):
        resolve_checkpoint(tmp_path)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(CheckpointNotFoundError, match=".pth"):
        resolve_checkpoint(other)
