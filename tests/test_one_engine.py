"""One decode loop: under minimind_trl/ only ``engine.decode.decode`` calls ``.generate(...)``, besides
``engine.turns.padded_generate_turns``, transformers' padded ``generate`` as TRL calls it
(``rollout.engine: trl``, one call per round of turns, no loop of its own) (issues 27 and 39).

Training's rounds of turns and evaluation's rollout are one driver (`envs.rollout.drive`) over
``minimind_trl.engine.decode.decode``; a second loop calling ``model.generate`` would bring back
the duplicated engine (two row states, two slice constants, two sampling schemes)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minimind_trl"


def functions_calling_generate(root: Path = PACKAGE) -> list[str]:
    """``module:function`` (package-relative module path, innermost enclosing function or ``<module>``)
    of every call ``<anything>.generate(...)``."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module = path.relative_to(root).as_posix()

        def visit(node, where):
            for child in ast.iter_child_nodes(node):
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
                func = child.func if isinstance(child, ast.Call) else None
                if isinstance(func, ast.Attribute) and func.attr == "generate":
                    found.add(f"{module}:{where}")
                visit(child, inner)

        visit(tree, "<module>")
    return sorted(found)


def test_only_the_decode_loop_and_the_padded_baseline_call_generate():
    assert functions_calling_generate() == ["engine/decode.py:decode", "engine/turns.py:padded_generate_turns"]


def test_the_check_sees_a_second_loop(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "decode.py").write_text("def decode(model):\n    return model.generate(x)\n")
    (tmp_path / "other.py").write_text("text = 'model.generate(x)'\ndef g(m):\n    return m.generate()\n")
    assert functions_calling_generate(tmp_path) == ["engine/decode.py:decode", "other.py:g"]


def test_training_and_evaluation_run_one_multi_turn_driver():
    """Issue 39: the trainer's tool rollout and evaluation's rollout both call ``envs.rollout.drive``,
    and only envs/rollout.py renders tool turns or parses model turns (the protocol defines them)."""
    callers, importers = {}, set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callers.setdefault(node.func.id, set()).add(module)
            if isinstance(node, ast.ImportFrom) and node.module == "minimind_trl.envs.rollout" \
                    and any(alias.name == "drive" for alias in node.names):
                importers.add(module)
    assert importers == {"trainer/grpo_trainer.py"}
    assert {"envs/rollout.py", "trainer/grpo_trainer.py"} <= callers["drive"]
    assert callers["tool_turn_ids"] == callers["parse_model_turn"] == {"envs/rollout.py"}
