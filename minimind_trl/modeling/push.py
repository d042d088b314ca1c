"""`minimind-trl push`: upload a model folder to the Hugging Face Hub.

    minimind-trl push runs/e1/grpo-seed42 someone/minimind-grpo [--private] [--dry-run]

FOLDER is a Hub-format model folder (``config.json`` and weights, as ``export`` and every run's
``final/`` write them) or a run folder, whose ``final/`` is uploaded: the run folder itself holds
checkpoints, optimizer state and TRL's draft card, none of which belongs on the Hub. The folder's
own ``README.md`` (the model card of ``export`` / ``save_for_hub``, which names no absolute path)
goes with it; a folder without one is refused. ``--dry-run`` lists what would be uploaded.
Credentials are huggingface_hub's (``HF_TOKEN`` or ``hf auth login``); the network is used only
here, and any failure (offline mode, no token, no permission) exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import filter_repo_objects

from minimind_trl.modeling.checkpoints import CheckpointError, resolve_checkpoint

IGNORED = [".staging-*", ".old-*", "*.tmp", ".*.lock"]
"""Left-overs of an interrupted atomic write (fsio): never uploaded."""


def upload_folder_of(path: str | Path) -> Path:
    """The folder to upload for ``path`` (a model folder, or a run folder's ``final/``); a
    :class:`CheckpointError` says why one cannot be uploaded."""
    folder = Path(path)
    if (folder / "final" / "config.json").is_file():  # a run folder
        folder = folder / "final"
    resolve_checkpoint(folder)  # config.json and weights, or CheckpointNotFoundError
    if not (folder / "README.md").is_file():
        raise CheckpointError(f"{folder} has no README.md model card: `minimind-trl export` writes one for a "
                              "MiniMind model; for another model (e.g. a reward model) write one yourself")
    return folder


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minimind-trl push", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="model folder (config.json + weights + README.md) or run folder (its final/)")
    p.add_argument("repo_id", help="Hub repository, e.g. someone/minimind-grpo (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repository private (default: public)")
    p.add_argument("--revision", default=None, help="branch to push to (default: the repository's default)")
    p.add_argument("--commit-message", default=None, help="commit message (default: 'Upload <folder name>')")
    p.add_argument("--dry-run", action="store_true", help="list the files that would be uploaded; upload nothing")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        folder = upload_folder_of(args.folder)
    except CheckpointError as exc:
        print(f"minimind-trl push: {exc}", file=sys.stderr)
        return 2
    everything = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files = list(filter_repo_objects(everything, ignore_patterns=IGNORED))  # huggingface_hub's own filter
    if args.dry_run:
        print(f"would upload {len(files)} files of {folder} to {args.repo_id}:")
        print("\n".join(f"  {name}" for name in files))
        return 0
    api = HfApi()
    try:
        api.create_repo(args.repo_id, private=args.private, exist_ok=True, repo_type="model")
        commit = api.upload_folder(folder_path=str(folder), repo_id=args.repo_id, repo_type="model",
                                   revision=args.revision, ignore_patterns=IGNORED,
                                   commit_message=args.commit_message or f"Upload {folder.name}")
    except OfflineModeIsEnabled:
        print("minimind-trl push: HF_HUB_OFFLINE is set: pushing needs the network (unset it for this command)",
              file=sys.stderr)
        return 2
    except Exception as exc:  # HTTP, connection (httpx), auth, disk: one line, whatever the library
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"minimind-trl push: {args.repo_id}: {first}", file=sys.stderr)
        return 2
    print(f"pushed {len(files)} files of {folder} to {getattr(commit, 'commit_url', args.repo_id)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
