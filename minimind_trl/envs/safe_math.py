"""A bounded arithmetic evaluator for untrusted expressions (no eval, no exec).

`evaluate_expression(text)` normalises the text, checks its size, parses it with `ast` and
walks the tree against a whitelist:

* numbers (int / float literals, scientific notation ``1.5e3``), constants ``pi`` (also ``π``)
  and ``e``;
* binary ``+ - * / // % **`` (``^`` is read as ``**``), unary ``+ -``, parentheses;
* calls of the named functions in `FUNCTIONS` with positional arguments only:
  sqrt, abs, round(x[, ndigits]), log(x[, base]), ln, log10, log2, exp, floor, ceil, min, max.

Normalisation: superscript powers become ``**`` (``2³`` → ``2**(3)``), then NFKC folds full-width
digits, operators and brackets to ASCII (``１２×（３＋４）``), and ``×`` ``÷`` ``−`` ``–`` become
``* / - -``. Anything else — names, attributes, subscripts, lambdas, comprehensions, strings,
keyword arguments, comparisons, tuples — is rejected with a `ToolError`.

Every piece of work is bounded before it is done:

* the text has at most `MAX_EXPRESSION_CHARS` characters and bracket nesting at most
  `MAX_NESTING` (checked by a scan *before* `ast.parse`, whose C parser would otherwise recurse
  on 10,000 nested parentheses), the tree at most `MAX_NODES` nodes and depth `MAX_AST_DEPTH`;
* every literal and every intermediate result satisfies ``|x| <= MAX_MAGNITUDE`` (1e18) and is
  finite and real;
* a power ``a ** b`` is computed only when ``b * log10|a| <= log10(MAX_MAGNITUDE)``, so
  ``9**9**9`` and ``10**100000`` fail in microseconds instead of allocating huge integers.

Integers stay exact (``2**62`` is an int, ``6/3`` with a zero remainder is the int 2).
"""

from __future__ import annotations

import ast
import math
import operator
import re
import unicodedata
from typing import Callable

from minimind_trl.envs.registry import ToolError

MAX_EXPRESSION_CHARS = 512
MAX_NESTING = 32
MAX_NODES = 256
MAX_AST_DEPTH = 100
MAX_MAGNITUDE = 10**18
MAX_FUNCTION_ARGS = 16
_LOG10_MAX = math.log10(MAX_MAGNITUDE)

Number = int | float

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_SUPERSCRIPT_RUN = re.compile(r"[⁺⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+")


def superscripts_to_power(text: str, power: str = "**") -> str:
    """Rewrite superscript exponents as explicit powers: ``10³`` → ``10**(3)``, ``2⁻¹`` →
    ``2**(-1)`` (done before NFKC, which would otherwise turn ``10³`` into ``103``)."""
    return _SUPERSCRIPT_RUN.sub(lambda m: f"{power}({m.group().translate(_SUPERSCRIPTS)})", text)


def normalize_expression(text: str) -> str:
    """Superscripts → powers, NFKC, then ``× ÷ − – ^ π`` → ``* / - - ** pi``."""
    text = unicodedata.normalize("NFKC", superscripts_to_power(text))
    for old, new in (("×", "*"), ("÷", "/"), ("−", "-"), ("–", "-"), ("^", "**"), ("π", "pi")):
        text = text.replace(old, new)
    return text.strip()


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth -= 1
    return deepest


def _checked(x: Number) -> Number:
    if isinstance(x, complex):
        raise ToolError("the result is not a real number")
    if isinstance(x, float) and not math.isfinite(x):
        raise ToolError("the result is not a finite number")
    if abs(x) > MAX_MAGNITUDE:
        raise ToolError(f"a value exceeds the magnitude limit {MAX_MAGNITUDE:.0e}")
    return x


def _power(base: Number, exponent: Number) -> Number:
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    if base != 0 and exponent * math.log10(abs(base)) > _LOG10_MAX:
        raise ToolError(f"the power exceeds the magnitude limit {MAX_MAGNITUDE:.0e}")
    if base < 0 and not float(exponent).is_integer():
        raise ToolError("a negative base needs an integer exponent")
    return base**exponent


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise ToolError("modulo by zero")
    return a % b


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: _divide,
    ast.FloorDiv: _floordiv, ast.Mod: _mod, ast.Pow: _power,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
CONSTANTS = {"pi": math.pi, "e": math.e}


def _sqrt(x: Number) -> Number:
    if x < 0:
        raise ToolError("sqrt of a negative number")
    if isinstance(x, int) and math.isqrt(x) ** 2 == x:
        return math.isqrt(x)
    return math.sqrt(x)


def _log(x: Number, base: Number | None = None) -> float:
    if x <= 0 or (base is not None and (base <= 0 or base == 1)):
        raise ToolError("log needs x > 0 and a base > 0, != 1")
    return math.log(x) if base is None else math.log(x, base)


def _round(x: Number, ndigits: Number = 0) -> Number:
    if not (isinstance(ndigits, int) and 0 <= ndigits <= 10):
        raise ToolError("round: ndigits must be an integer from 0 to 10")
    return round(x) if ndigits == 0 else round(x, ndigits)


def _positive(name: str, func: Callable[[float], float]) -> Callable[[Number], float]:
    def wrapped(x: Number) -> float:
        if x <= 0:
            raise ToolError(f"{name} needs a positive argument")
        return func(x)
    return wrapped


def _exp(x: Number) -> float:
    if x > _LOG10_MAX * math.log(10):
        raise ToolError(f"exp exceeds the magnitude limit {MAX_MAGNITUDE:.0e}")
    return math.exp(x)


FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, min args, max args)
    "sqrt": (_sqrt, 1, 1), "abs": (abs, 1, 1), "round": (_round, 1, 2), "log": (_log, 1, 2),
    "ln": (_log, 1, 1), "log10": (_positive("log10", math.log10), 1, 1),
    "log2": (_positive("log2", math.log2), 1, 1), "exp": (_exp, 1, 1),
    "floor": (math.floor, 1, 1), "ceil": (math.ceil, 1, 1),
    "min": (min, 1, MAX_FUNCTION_ARGS), "max": (max, 1, MAX_FUNCTION_ARGS),
}


def _check_tree(tree: ast.AST) -> None:
    """Reject big or deep trees without recursion (an explicit stack of (node, depth))."""
    stack, count = [(tree, 0)], 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ToolError(f"the expression has more than {MAX_NODES} parts")
        if depth > MAX_AST_DEPTH:
            raise ToolError(f"the expression is nested deeper than {MAX_AST_DEPTH}")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"unsupported literal {type(node.value).__name__}")
        return _checked(node.value)
    if isinstance(node, ast.Name):
        if node.id not in CONSTANTS:
            raise ToolError(f"unknown name {node.id[:32]!r}")
        return CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ToolError("only the functions " + ", ".join(FUNCTIONS) + " can be called")
        func, low, high = FUNCTIONS[node.func.id]
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ToolError("functions take positional arguments only")
        if not low <= len(node.args) <= high:
            raise ToolError(f"{node.func.id} takes {low} to {high} arguments")
        return _checked(func(*[_evaluate(a) for a in node.args]))
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


def evaluate_expression(text: str) -> Number:
    """Evaluate an arithmetic expression under the bounds above; raises `ToolError`."""
    if not isinstance(text, str):
        raise ToolError("the expression must be a string")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    expression = normalize_expression(text)
    if not expression:
        raise ToolError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if _nesting_depth(expression) > MAX_NESTING:
        raise ToolError(f"brackets are nested deeper than {MAX_NESTING}")
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError(f"invalid expression: {text[:80]!r}") from None
    _check_tree(tree)
    try:
        return _checked(_evaluate(tree))
    except ToolError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise ToolError(f"math error: {exc}") from None
