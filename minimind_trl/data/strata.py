"""Strata for split stratification: (number of GT values, coarse operation type).

Rows from the generator carry ``meta.op_type``; upstream rows do not, so the type is inferred from
the normalised question text by the first matching rule:

1. ``chain`` -- two or more GT values and a step marker: English ``then``, ``the result``,
   ``that result``, ``previous result``; Chinese ``然后``, ``接着``, ``结果``, ``上一步``.
2. ``exchange_rate`` -- a currency code (USD, CNY, RMB, EUR, JPY, GBP, HKD, KRW, AUD, CAD, CHF,
   SGD) or ``exchange rate`` / ``汇率`` / a currency word (美元, 人民币, 欧元, 日元, 英镑, 港币, 韩元).
3. ``unit_conversion`` -- ``convert``/``conversion`` or ``换算``/``转换``/``折合``.
4. ``percentage`` -- ``%``, ``percent`` or ``百分之``.
5. ``power`` -- ``**``, ``^``, ``power``, ``squared``, ``cubed``, ``次方``, ``平方``, ``立方``.
6. ``arithmetic`` -- anything else.

The language is ``zh`` when the user text holds a CJK ideograph, else ``en``.
"""

from __future__ import annotations

import re

OP_TYPES = ("arithmetic", "percentage", "power", "unit_conversion", "exchange_rate", "chain")

_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("exchange_rate", re.compile(
        r"\b(USD|CNY|RMB|EUR|JPY|GBP|HKD|KRW|AUD|CAD|CHF|SGD)\b|exchange rate"
        r"|汇率|美元|人民币|欧元|日元|英镑|港币|韩元",
        re.IGNORECASE)),
    ("unit_conversion", re.compile(r"\bconver(t|sion)|换算|转换|折合", re.IGNORECASE)),
    ("percentage", re.compile(r"%|percent|百分之", re.IGNORECASE)),
    ("power", re.compile(r"\*\*|\^|\bpower\b|squared|cubed|次方|平方|立方", re.IGNORECASE)),
)
_CHAIN = re.compile(r"\bthen\b|\bthe result\b|\bthat result\b|\bprevious result\b|然后|接着|结果|上一步", re.IGNORECASE)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


def infer_op_type(question: str, n_gt: int) -> str:
    """Coarse operation type of a question (rules in the module docstring)."""
    if n_gt >= 2 and _CHAIN.search(question):
        return "chain"
    for op_type, pattern in _RULES:
        if pattern.search(question):
            return op_type
    return "arithmetic"


def infer_lang(question: str) -> str:
    """``"zh"`` if the text holds a CJK ideograph, else ``"en"``."""
    return "zh" if _CJK.search(question) else "en"


def stratum_key(n_gt: int, op_type: str) -> str:
    """The stratum label used in manifests, e.g. ``"2|chain"``."""
    return f"{n_gt}|{op_type}"
