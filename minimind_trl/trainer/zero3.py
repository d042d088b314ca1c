"""DeepSpeed ZeRO-3 in one place: the full weights when a process needs them, true parameter
counts, and DeepSpeed's own process group on CPU ranks.

Under ZeRO-3 (``zero3_init_flag: true`` in accelerate_configs/deepspeed_zero3.yaml) transformers
builds every model inside ``deepspeed.zero.Init``: each process holds a 1/world slice of each
parameter and ``p.numel()`` is 0 outside a gather. Gathering is a collective, so every process
enters :func:`full_weights` together, the same number of times (issue 25 A and C).

DeepSpeed guesses its accelerator when it is imported and warns on a machine without one; there
this module names the CPU (``DS_ACCELERATOR=cpu``, what DeepSpeed would pick) before importing it,
so that no CPU command prints that warning.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

if not torch.accelerator.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

try:
    import deepspeed  # after DS_ACCELERATOR
except ImportError:  # the optional extra minimind-trl[deepspeed]: nothing here runs without it
    deepspeed = None


def is_partitioned(model: torch.nn.Module) -> bool:
    """True when the model's parameters are ZeRO-3 slices (``ds_id`` marks them)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every process holds the whole of ``model``'s parameters inside the block (read-only: changes
    are not written back); a no-op unless the model is ZeRO-3 partitioned. A collective: call it
    on every process. Memory: one full copy of the weights per process while it lasts."""
    if not is_partitioned(model):  # only DeepSpeed's zero.Init marks parameters so
        yield model
        return
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
        yield model


def num_parameters(model: torch.nn.Module) -> int:
    """Parameter count, whole even for ZeRO-3 slices (``ds_numel``)."""
    return sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())


def init_deepspeed_comm_on_cpu(use_cpu: bool) -> None:
    """On CPU ranks accelerate initialises torch's process group but not DeepSpeed's
    (``deepspeed.comm``); ZeRO-3 engines built later (TRL's reference model for DPO and for GRPO
    with ``beta > 0``) then see world size 1 and fail. Initialise it over gloo, as accelerate
    does on GPUs with their backend (issue 25 E). Only under ``accelerate launch`` with a
    DeepSpeed config (``ACCELERATE_USE_DEEPSPEED``) and several processes."""
    if not use_cpu or os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true":
        return
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return
    if deepspeed is None:
        raise RuntimeError("accelerate launch with a DeepSpeed config needs DeepSpeed: pip install -e '.[deepspeed]'")
    if not deepspeed.comm.is_initialized():
        deepspeed.comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
