"""One decode loop: exactly one module under minimind_trl/ calls ``.generate(...)`` (issue 27).

Training's ``generate_turns`` and evaluation's ``rollout`` are callers of
``minimind_trl.engine.decode.decode``; a second loop calling ``model.generate`` would bring back
the duplicated engine (two row states, two slice constants, two sampling schemes)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minimind_trl"


def modules_calling_generate(root: Path = PACKAGE) -> list[str]:
    """Package-relative paths of the modules with a call ``<anything>.generate(...)``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "generate"
               for node in ast.walk(tree)):
            found.append(path.relative_to(root).as_posix())
    return found


def test_exactly_one_module_calls_generate():
    assert modules_calling_generate() == ["engine/decode.py"]


def test_the_check_sees_a_second_loop(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "decode.py").write_text("def f(model):\n    return model.generate(x)\n")
    (tmp_path / "other.py").write_text("text = 'model.generate(x)'\ndef g(m):\n    return m.generate()\n")
    assert modules_calling_generate(tmp_path) == ["engine/decode.py", "other.py"]
