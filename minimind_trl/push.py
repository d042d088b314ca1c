"""`minimind-trl push`: upload a model folder to the Hugging Face Hub.

    minimind-trl push runs/e1/grpo-seed42 someone/minimind-grpo [--private] [--dry-run]

FOLDER is a Hub-format model folder (``config.json`` and weights, as ``export`` and every run's
``final/`` write them) or a run folder, whose ``final/`` is uploaded: the run folder itself holds
checkpoints, optimizer state and TRL's draft card, none of which belongs on the Hub. The folder's
own ``README.md`` (the model card of ``export`` / ``save_for_hub``, which names no absolute path)
goes with it; a folder without one is refused. With ``--eval EVAL_DIR`` (an evaluation of these
very weights: its manifest's checkpoint SHA-256 must match) and/or ``--base-model HUB_ID`` the card
of a ``minimind``-format folder is written anew for the upload, from the run's manifest, with the
evaluation's headline metrics, the base model and the target repository in its load snippet (the
folder on disk is left as it is). What is uploaded is one list (:func:`upload_list`): every file of
the folder but dot-files and dot-folders (``.env``, ``.git``, the leftovers of interrupted writes),
which are named as left out; a symlink leading outside the folder refuses the push. ``--dry-run``
prints that list (and the card); the upload commits exactly its files, one commit.
Credentials are huggingface_hub's (``HF_TOKEN`` or ``hf auth login``); the network is used only
here, and any failure (offline mode, no token, no permission) exits 2 with one line.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import OfflineModeIsEnabled

from minimind_trl.eval.folder import EvalFolder
from minimind_trl.fsio import DataFormatError, read_json_file
from minimind_trl.modeling import MiniMindForCausalLM
from minimind_trl.modeling.card import model_card, read_manifest
from minimind_trl.modeling.checkpoints import CheckpointError, resolve_checkpoint
from minimind_trl.run_folder import MANIFEST

LEFTOVERS = (".staging-*", ".old-*", "*.tmp", ".*.lock")
"""Left-overs of an interrupted atomic write (fsio): never uploaded, not listed."""
DOT_FILE = "a dot-file: dot-files and dot-folders (.env, .git, ...) are never uploaded"


@dataclass(frozen=True)
class UploadList:
    """What push uploads from a folder (``files``, paths relative to it, sorted) and what it leaves out
    (``left_out``: path -> why). The dry run prints both; the upload commits exactly ``files``."""

    files: tuple[str, ...]
    left_out: dict[str, str]


def _is_leftover(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in LEFTOVERS)


def upload_list(folder: Path) -> UploadList:
    """The one list of files push uploads from ``folder`` (the dry run prints it): every regular
    file under it, links to files inside it included, but no dot-file or dot-folder (named in
    ``left_out``, but for :data:`LEFTOVERS`). A symlink that leads outside the folder raises
    :class:`CheckpointError`."""
    root = folder.resolve()
    files, left_out = [], {}
    for top, dirs, names in os.walk(folder, followlinks=False):
        here = Path(top)
        for name in sorted(dirs):
            relative = (here / name).relative_to(folder).as_posix()
            if name.startswith(".") or (here / name).is_symlink():
                dirs.remove(name)
                _check_inside(here / name, root, folder)
                if not _is_leftover(name):
                    left_out[relative + "/"] = DOT_FILE if name.startswith(".") else "a linked folder"
        for name in names:
            path, relative = here / name, (here / name).relative_to(folder).as_posix()
            _check_inside(path, root, folder)
            if name.startswith("."):
                if not _is_leftover(name):
                    left_out[relative] = DOT_FILE
            elif path.is_file():
                files.append(relative)
            else:
                left_out[relative] = "not a regular file"
    return UploadList(tuple(sorted(files)), dict(sorted(left_out.items())))


def _check_inside(path: Path, root: Path, folder: Path) -> None:
    """A symlink must lead to a place inside the folder being pushed."""
    if path.is_symlink():
        target = path.resolve()
        if target != root and root not in target.parents:
            raise CheckpointError(f"{path} links outside {folder} (to {target}); push uploads only the folder's own "
                                  "files: replace the link with a copy or remove it")


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


HEADLINE_METRICS = ("task_success", "macro_gt_coverage", "tool_call_rate", "mean_tool_calls", "count")
"""What a card shows of an evaluation's metrics.json (``count``: the questions)."""


def eval_metrics(eval_dir: str | Path, folder: Path) -> dict:
    """The headline metrics of ``eval_dir`` plus its split, refused unless it evaluated ``folder``'s weights."""
    evaluation = EvalFolder(eval_dir)
    manifest = evaluation.manifest()
    if manifest is None or not evaluation.metrics_path.is_file():
        raise CheckpointError(f"--eval {eval_dir}: not a finished eval folder")
    if manifest.get("checkpoint", {}).get("sha256") != resolve_checkpoint(folder).sha256:
        raise CheckpointError(f"--eval {eval_dir}: evaluated other weights than {folder} (SHA-256 differs)")
    try:
        metrics = read_json_file(evaluation.metrics_path)
    except DataFormatError as exc:
        raise CheckpointError(f"--eval {eval_dir}: {exc}") from None
    shown = {name: metrics[name] for name in HEADLINE_METRICS if name in metrics}
    return {"split": (manifest.get("split") or {}).get("name"), **shown}


def fresh_card(folder: Path, repo_id: str, base_model: str | None, eval_dir: str | None) -> str:
    """The model card of a ``minimind``-format ``folder`` written anew (see the module docstring)."""
    if not (folder / "modeling_minimind.py").is_file():
        raise CheckpointError(f"{folder}: --eval and --base-model rewrite the card of a minimind-format folder; "
                              "for a qwen3 export, pass the metrics to save_for_hub when exporting")
    model = MiniMindForCausalLM.from_pretrained(str(folder))
    run_manifest = folder.parent / MANIFEST
    manifest = read_manifest(run_manifest) if run_manifest.is_file() else None
    metrics = eval_metrics(eval_dir, folder) if eval_dir else None
    return model_card(model, "minimind", manifest=manifest, metrics=metrics, base_model=base_model,
                      repo_id=repo_id, with_tokenizer=(folder / "tokenizer.json").is_file())


def _operations(folder: Path, files: tuple[str, ...], card: str | None) -> list[CommitOperationAdd]:
    """One commit operation per listed file; the rewritten card, when there is one, replaces README.md."""
    return [CommitOperationAdd(path_in_repo=name, path_or_fileobj=card.encode("utf-8")
                               if card is not None and name == "README.md" else str(folder / name))
            for name in files]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minimind-trl push", description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="model folder (config.json + weights + README.md) or run folder (its final/)")
    p.add_argument("repo_id", help="Hub repository, e.g. someone/minimind-grpo (created if missing)")
    p.add_argument("--private", action="store_true", help="create the repository private (default: public)")
    p.add_argument("--revision", default=None, help="branch to push to (default: the repository's default)")
    p.add_argument("--commit-message", default=None, help="commit message (default: 'Upload <folder name>')")
    p.add_argument("--eval", default=None, metavar="EVAL_DIR",
                   help="an eval folder of these weights: its headline metrics go into the card")
    p.add_argument("--base-model", default=None, metavar="HUB_ID", help="the card's base_model (a Hub id)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the files that would be uploaded (and print a rewritten card); upload nothing")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        folder = upload_folder_of(args.folder)
        listing = upload_list(folder)
        card = fresh_card(folder, args.repo_id, args.base_model, args.eval) if args.eval or args.base_model else None
    except (CheckpointError, OSError, ValueError) as exc:
        print(f"minimind-trl push: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"would upload {len(listing.files)} files of {folder} to {args.repo_id}:")
        print("\n".join(f"  {name}" for name in listing.files))
        _print_left_out(listing)
        if card is not None:
            print("\nwith this README.md:\n" + card)
        return 0
    api = HfApi()
    try:
        api.create_repo(args.repo_id, private=args.private, exist_ok=True, repo_type="model")
        commit = api.create_commit(args.repo_id, _operations(folder, listing.files, card), repo_type="model",
                                   revision=args.revision,
                                   commit_message=args.commit_message or f"Upload {folder.name}")
    except OfflineModeIsEnabled:
        print("minimind-trl push: HF_HUB_OFFLINE is set: pushing needs the network (unset it for this command)",
              file=sys.stderr)
        return 2
    except Exception as exc:  # HTTP, connection (httpx), auth, disk: one line, whatever the library
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        print(f"minimind-trl push: {args.repo_id}: {first}", file=sys.stderr)
        return 2
    print(f"pushed {len(listing.files)} files of {folder} to {getattr(commit, 'commit_url', args.repo_id)}")
    _print_left_out(listing)
    return 0


def _print_left_out(listing: UploadList) -> None:
    if listing.left_out:
        print(f"not uploaded ({len(listing.left_out)}):")
        print("\n".join(f"  {name}  ({why})" for name, why in listing.left_out.items()))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
