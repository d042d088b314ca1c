"""Split-folder manifests: :func:`verify_manifest` checks the SHA-256 every listed output records.

The hashing and atomic writers this audit trail is built on (every file that matters is written
to a temporary file in the destination folder, fsynced, then moved into place with
:func:`os.replace`) live in :mod:`minimind_trl.fsio`.
"""

from __future__ import annotations

import os
from pathlib import Path

from minimind_trl.fsio import DataFormatError, read_json_file, sha256_file

__all__ = ["verify_manifest"]


def verify_manifest(folder: str | os.PathLike, manifest_name: str = "manifest.json") -> dict:
    """Check that every file listed under the manifest's ``"outputs"`` has its recorded SHA-256.

    Returns the manifest. Raises ``ValueError`` naming the first file that is missing or differs,
    :class:`~minimind_trl.fsio.DataFormatError` for a malformed manifest.
    """
    folder = Path(folder)
    manifest_path = folder / manifest_name
    manifest = read_json_file(manifest_path)
    outputs = manifest.get("outputs") if isinstance(manifest, dict) else None
    if not isinstance(outputs, dict) or not outputs:
        raise DataFormatError(manifest_path, None, "outputs",
                              "is missing or empty (a manifest is an object listing its outputs)")
    for name, record in outputs.items():
        if Path(name).name != name or name in ("", ".", ".."):
            raise DataFormatError(manifest_path, None, f"outputs.{name}", "must be a plain file name in the folder")
        if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
            raise DataFormatError(manifest_path, None, f"outputs.{name}.sha256", "must be a hex string")
        file_path = folder / name
        if not file_path.is_file():
            raise ValueError(f"{manifest_path}: listed output {name!r} does not exist")
        actual = sha256_file(file_path)
        if actual != record["sha256"]:
            raise ValueError(f"{manifest_path}: {name} has sha256 {actual}, manifest records {record['sha256']}")
    return manifest
