"""The non-finite stop names what went wrong on this process (a single process never blames another)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_trainer

from minimind_trl.trainer.errors import NonFiniteError


def test_nan_gradient_with_finite_loss_is_named_on_a_single_process(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, num_iterations=2, save_strategy="no")
    weight = next(p for p in trainer.model.parameters() if p.requires_grad)
    weight.register_hook(lambda grad: grad + float("nan") if trainer.state.global_step == 1 else grad)
    with pytest.raises(NonFiniteError) as info:
        trainer.train()
    message = str(info.value)
    assert "at step 2 (grad_norm=nan)" in message
    assert "every loss was finite, the gradient was not" in message
    assert "another process" not in message
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
