"""The built-in tools, written as a tool plugin: this module's `register(registry)` is what
`load_tool_plugin(registry, "minimind_trl.envs.builtin_tools")` (`minimind_trl.envs.tools`) calls,
exactly as for a third-party plugin.

All tools are deterministic: the exchange rates, weather and clock are fixed mock data (no
network, no real time), and `random_number` is seeded by its own arguments. Tools return a
number or a string; the registry turns it into ``{"result": "..."}`` (numbers via
`format_number`) and a `ToolError` into ``{"error": "..."}``.
"""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from datetime import datetime, timedelta, timezone

from minimind_trl.envs.registry import ToolError, ToolRegistry
from minimind_trl.envs.safe_math import MAX_MAGNITUDE, evaluate_expression

# ---------------------------------------------------------------------------------------------
# Units. UNIT_FACTORS[unit] = (dimension, factor): 1 unit = factor × the dimension's base unit
# (length m, mass kg, time s, volume L, area m², speed m/s). Temperature is affine and handled
# by formula (TEMPERATURE_UNITS). UNIT_ALIASES maps other spellings (case-insensitive, after
# NFKC; Chinese names included) to these canonical names.
UNIT_FACTORS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01),
    "mm": ("length", 0.001), "mile": ("length", 1609.344), "ft": ("length", 0.3048),
    "in": ("length", 0.0254), "yd": ("length", 0.9144), "nmi": ("length", 1852.0),
    "li": ("length", 500.0),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "mg": ("mass", 1e-6), "t": ("mass", 1000.0),
    "lb": ("mass", 0.45359237), "oz": ("mass", 0.028349523125), "jin": ("mass", 0.5),
    "liang": ("mass", 0.05),
    "s": ("time", 1.0), "ms": ("time", 0.001), "min": ("time", 60.0), "h": ("time", 3600.0),
    "day": ("time", 86400.0), "week": ("time", 604800.0),
    "l": ("volume", 1.0), "ml": ("volume", 0.001), "m3": ("volume", 1000.0),
    "gallon": ("volume", 3.785411784),
    "m2": ("area", 1.0), "cm2": ("area", 1e-4), "km2": ("area", 1e6), "ha": ("area", 1e4),
    "mu": ("area", 10000 / 15), "acre": ("area", 4046.8564224),
    "m/s": ("speed", 1.0), "km/h": ("speed", 1 / 3.6), "mph": ("speed", 0.44704),
}
TEMPERATURE_UNITS = ("celsius", "fahrenheit", "kelvin")
UNIT_ALIASES: dict[str, str] = {
    "meter": "m", "meters": "m", "metre": "m", "米": "m", "公尺": "m",
    "kilometer": "km", "kilometers": "km", "千米": "km", "公里": "km",
    "centimeter": "cm", "centimeters": "cm", "厘米": "cm", "millimeter": "mm", "毫米": "mm",
    "miles": "mile", "mi": "mile", "英里": "mile", "foot": "ft", "feet": "ft", "英尺": "ft",
    "inch": "in", "inches": "in", "英寸": "in", "yard": "yd", "yards": "yd", "码": "yd",
    "nautical mile": "nmi", "海里": "nmi", "里": "li", "市里": "li",
    "kilogram": "kg", "kilograms": "kg", "千克": "kg", "公斤": "kg", "gram": "g", "grams": "g",
    "克": "g", "milligram": "mg", "毫克": "mg", "ton": "t", "tons": "t", "tonne": "t",
    "tonnes": "t", "吨": "t", "pound": "lb", "pounds": "lb", "lbs": "lb", "磅": "lb",
    "ounce": "oz", "ounces": "oz", "盎司": "oz", "斤": "jin", "市斤": "jin", "两": "liang",
    "second": "s", "seconds": "s", "sec": "s", "秒": "s", "毫秒": "ms", "millisecond": "ms",
    "minute": "min", "minutes": "min", "分钟": "min", "hour": "h", "hours": "h", "hr": "h",
    "小时": "h", "days": "day", "d": "day", "天": "day", "日": "day", "weeks": "week",
    "周": "week", "星期": "week",
    "liter": "l", "liters": "l", "litre": "l", "升": "l", "公升": "l", "milliliter": "ml",
    "毫升": "ml", "cubic meter": "m3", "立方米": "m3", "gal": "gallon", "gallons": "gallon",
    "加仑": "gallon",
    "square meter": "m2", "sqm": "m2", "平方米": "m2", "平方厘米": "cm2", "平方千米": "km2",
    "平方公里": "km2", "hectare": "ha", "公顷": "ha", "亩": "mu", "acres": "acre", "英亩": "acre",
    "mps": "m/s", "米/秒": "m/s", "米每秒": "m/s", "kph": "km/h", "kmh": "km/h",
    "千米/小时": "km/h", "公里/小时": "km/h", "公里每小时": "km/h", "英里/小时": "mph",
    "c": "celsius", "°c": "celsius", "摄氏度": "celsius", "f": "fahrenheit",
    "°f": "fahrenheit", "华氏度": "fahrenheit", "k": "kelvin", "开尔文": "kelvin",
}


def canonical_unit(unit: str) -> str:
    """Canonical unit name (NFKC, case-insensitive, aliases resolved); raises `ToolError`."""
    key = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", unit)).strip().casefold()
    key = key.replace("²", "2").replace("³", "3")
    key = UNIT_ALIASES.get(key, key)
    if key not in UNIT_FACTORS and key not in TEMPERATURE_UNITS:
        raise ToolError(f"unknown unit {unit[:32]!r}")
    return key


def _to_kelvin(value: float, unit: str) -> float:
    return {"celsius": value + 273.15, "fahrenheit": (value - 32) * 5 / 9 + 273.15,
            "kelvin": value}[unit]


def _from_kelvin(kelvin: float, unit: str) -> float:
    return {"celsius": kelvin - 273.15, "fahrenheit": (kelvin - 273.15) * 9 / 5 + 32,
            "kelvin": kelvin}[unit]


def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """value × factor(from) / factor(to) within one dimension; temperatures by formula
    (K = °C + 273.15, °F = °C × 9/5 + 32). Raises `ToolError` on unknown or mismatched units."""
    source, target = canonical_unit(from_unit), canonical_unit(to_unit)
    if abs(value) > MAX_MAGNITUDE:
        raise ToolError("the value is too large")
    if source in TEMPERATURE_UNITS or target in TEMPERATURE_UNITS:
        if not (source in TEMPERATURE_UNITS and target in TEMPERATURE_UNITS):
            raise ToolError(f"cannot convert {source} to {target}")
        kelvin = _to_kelvin(value, source)
        if kelvin < -1e-9:
            raise ToolError("the temperature is below absolute zero")
        return _from_kelvin(kelvin, target)
    (dim_a, factor_a), (dim_b, factor_b) = UNIT_FACTORS[source], UNIT_FACTORS[target]
    if dim_a != dim_b:
        raise ToolError(f"cannot convert {dim_a} ({source}) to {dim_b} ({target})")
    return value * factor_a / factor_b


# ---------------------------------------------------------------------------------------------
# Exchange rates: a fixed, illustrative table (not market data) of CNY per 1 unit of each
# currency. The rate from A to B is EXCHANGE_RATES[A] / EXCHANGE_RATES[B], so every cross rate
# is consistent (rate(A, B) × rate(B, C) = rate(A, C) before rounding). The tool reports the
# rate written by format_number (4 decimals); a task that multiplies an amount by the rate
# should use that reported value.
EXCHANGE_RATES: dict[str, float] = {
    "CNY": 1.0, "USD": 7.2, "EUR": 7.8, "GBP": 9.1, "JPY": 0.048, "HKD": 0.92, "AUD": 4.7,
    "CAD": 5.3, "SGD": 5.35, "CHF": 8.1, "KRW": 0.0053,
}
CURRENCY_ALIASES: dict[str, str] = {
    "人民币": "CNY", "元": "CNY", "RMB": "CNY", "YUAN": "CNY", "美元": "USD", "美金": "USD",
    "US DOLLAR": "USD", "欧元": "EUR", "EURO": "EUR", "英镑": "GBP", "日元": "JPY", "YEN": "JPY",
    "港币": "HKD", "港元": "HKD", "澳元": "AUD", "加元": "CAD", "新加坡元": "SGD",
    "瑞士法郎": "CHF", "韩元": "KRW",
}


def canonical_currency(currency: str) -> str:
    key = unicodedata.normalize("NFKC", currency).strip().upper()
    key = CURRENCY_ALIASES.get(key, key)
    if key not in EXCHANGE_RATES:
        raise ToolError(f"unknown currency {currency[:32]!r}; known: {', '.join(EXCHANGE_RATES)}")
    return key


def exchange_rate(from_currency: str, to_currency: str) -> float:
    """Units of ``to_currency`` per 1 ``from_currency`` (unrounded)."""
    return (EXCHANGE_RATES[canonical_currency(from_currency)]
            / EXCHANGE_RATES[canonical_currency(to_currency)])


# ---------------------------------------------------------------------------------------------
# Mock weather and clock.
WEATHER: dict[str, tuple[str, int, int]] = {
    # city: (condition, temperature °C, humidity %)
    "北京": ("晴", 28, 40), "Beijing": ("sunny", 28, 40), "上海": ("多云", 15, 70),
    "Shanghai": ("cloudy", 15, 70), "广州": ("阵雨", 32, 85), "Guangzhou": ("showers", 32, 85),
    "深圳": ("晴", 30, 75), "Shenzhen": ("sunny", 30, 75), "杭州": ("阴", 22, 65),
    "Hangzhou": ("overcast", 22, 65), "Tokyo": ("sunny", 12, 50), "东京": ("晴", 12, 50),
    "New York": ("cloudy", 8, 55), "纽约": ("多云", 8, 55), "London": ("light rain", 5, 80),
    "伦敦": ("小雨", 5, 80), "Paris": ("overcast", 10, 60), "巴黎": ("阴", 10, 60),
}
_CONDITIONS = ("sunny", "cloudy", "overcast", "light rain", "windy")

FIXED_UTC_NOW = datetime(2025, 3, 7, 6, 30, 0, tzinfo=timezone.utc)
"""The mock clock: every get_current_time call sees this instant (2025-03-07 06:30:00 UTC)."""
TIMEZONE_OFFSETS: dict[str, float] = {
    # UTC offsets in hours on 2025-03-07 (before the US switch to summer time on 03-09;
    # Sydney is on summer time).
    "Asia/Shanghai": 8, "Asia/Hong_Kong": 8, "Asia/Singapore": 8, "Asia/Tokyo": 9,
    "Asia/Seoul": 9, "Asia/Kolkata": 5.5, "Asia/Dubai": 4, "Europe/London": 0,
    "Europe/Paris": 1, "Europe/Berlin": 1, "Europe/Moscow": 3, "America/New_York": -5,
    "America/Chicago": -6, "America/Los_Angeles": -8, "Australia/Sydney": 11, "UTC": 0,
}
_TIMEZONE_ALIASES = {"GMT": "UTC", "北京": "Asia/Shanghai", "上海": "Asia/Shanghai",
                     "东京": "Asia/Tokyo", "伦敦": "Europe/London", "巴黎": "Europe/Paris",
                     "纽约": "America/New_York", "悉尼": "Australia/Sydney"}


def _utc_offset_hours(tz: str) -> float:
    name = _TIMEZONE_ALIASES.get(tz.strip(), tz.strip())
    for known, offset in TIMEZONE_OFFSETS.items():
        if known.casefold() == name.casefold():
            return offset
    match = re.fullmatch(r"(?:UTC|GMT)\s*([+-])\s*(\d{1,2})(?::(\d{2}))?", name, re.IGNORECASE)
    if match and int(match.group(2)) <= 14 and int(match.group(3) or 0) < 60:
        hours = int(match.group(2)) + int(match.group(3) or 0) / 60
        return hours if match.group(1) == "+" else -hours
    raise ToolError(f"unknown timezone {tz[:40]!r}")


# ---------------------------------------------------------------------------------------------
# Translation: a tiny fixed dictionary; unknown text is echoed with a language tag.
LANGUAGE_ALIASES: dict[str, str] = {
    "en": "en", "english": "en", "英语": "en", "英文": "en", "zh": "zh", "chinese": "zh",
    "中文": "zh", "汉语": "zh", "ja": "ja", "japanese": "ja", "日语": "ja", "日文": "ja",
    "fr": "fr", "french": "fr", "法语": "fr", "de": "de", "german": "de", "德语": "de",
    "es": "es", "spanish": "es", "西班牙语": "es", "ko": "ko", "korean": "ko", "韩语": "ko",
}
_PAIRS_ZH_EN = [("你好", "hello"), ("谢谢", "thank you"), ("早上好", "good morning"),
                ("你好世界", "hello world"), ("我喜欢编程", "I love programming"),
                ("生日快乐", "happy birthday"), ("猫", "cat"), ("狗", "dog"), ("苹果", "apple"),
                ("水", "water")]
TRANSLATIONS: dict[tuple[str, str], str] = {
    **{(zh, "en"): en for zh, en in _PAIRS_ZH_EN},
    **{(en.casefold(), "zh"): zh for zh, en in _PAIRS_ZH_EN},
    ("hello", "ja"): "こんにちは", ("thank you", "ja"): "ありがとう", ("hello", "fr"): "bonjour",
    ("thank you", "fr"): "merci", ("hello", "de"): "hallo", ("thank you", "de"): "danke",
    ("hello", "es"): "hola", ("thank you", "es"): "gracias", ("hello", "ko"): "안녕하세요",
}


# ---------------------------------------------------------------------------------------------
# The tools (their docstrings become the schemas the model sees).

def calculate_math(expression: str) -> int | float:
    """Evaluate an arithmetic expression, e.g. "(12 + 7) * 3" or "sqrt(2) ^ 2".

    Args:
        expression: The expression: numbers, + - * / // % ** ^ and parentheses, and the
            functions sqrt, abs, round, log, ln, log10, log2, exp, floor, ceil, min, max.
    """
    return evaluate_expression(expression)


def unit_converter(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a value between units of length, mass, time, volume, area, speed or temperature.

    Args:
        value: The number to convert.
        from_unit: The unit of the value, e.g. "km", "kg", "celsius", "公里".
        to_unit: The unit to convert to, e.g. "m", "g", "fahrenheit", "米".
    """
    return convert_units(value, from_unit, to_unit)


def get_exchange_rate(from_currency: str, to_currency: str) -> float:
    """Get the exchange rate: how many units of to_currency one unit of from_currency buys.

    Args:
        from_currency: The currency code to convert from, e.g. "USD".
        to_currency: The currency code to convert to, e.g. "CNY".
    """
    return exchange_rate(from_currency, to_currency)


def get_current_weather(location: str) -> str:
    """Get the current weather of a city.

    Args:
        location: The city name, e.g. "北京" or "London".
    """
    place = location.strip()
    if not place:
        raise ToolError("location must not be empty")
    if place in WEATHER:
        condition, temperature, humidity = WEATHER[place]
    else:
        digest = hashlib.sha256(place.encode("utf-8")).digest()
        condition = _CONDITIONS[digest[0] % len(_CONDITIONS)]
        temperature, humidity = digest[1] % 36 - 5, 20 + digest[2] % 71
    return f"{place}: {condition}, {temperature}°C, humidity {humidity}%"


def get_current_time(timezone: str = "Asia/Shanghai") -> str:
    """Get the current local date and time of a timezone.

    Args:
        timezone: An IANA timezone name such as "Asia/Shanghai", or an offset like "UTC+8".
    """
    local = FIXED_UTC_NOW + timedelta(hours=_utc_offset_hours(timezone))
    return local.strftime("%Y-%m-%d %H:%M:%S")


def translate_text(text: str, target_language: str) -> str:
    """Translate a short text into another language.

    Args:
        text: The text to translate.
        target_language: The target language, e.g. "english", "chinese", "fr".
    """
    language = LANGUAGE_ALIASES.get(target_language.strip().casefold())
    if language is None:
        raise ToolError(f"unsupported target language {target_language[:32]!r}")
    source = text.strip()
    return TRANSLATIONS.get((source.casefold(), language),
                            TRANSLATIONS.get((source, language), f"[{language}] {source}"))


def random_number(min: int, max: int) -> int:  # noqa: A002 - upstream parameter names
    """Draw an integer between min and max (inclusive).

    Args:
        min: The smallest allowed value.
        max: The largest allowed value.
    """
    if min > max:
        raise ToolError("min must not exceed max")
    if abs(min) > MAX_MAGNITUDE or abs(max) > MAX_MAGNITUDE:
        raise ToolError("the bounds are too large")
    return random.Random(f"random_number:{min}:{max}").randint(min, max)


def text_length(text: str) -> int:
    """Count the characters (Unicode code points) of a text.

    Args:
        text: The text to measure.
    """
    return len(text)


BUILTIN_TOOLS = (calculate_math, unit_converter, get_exchange_rate, get_current_weather,
                 get_current_time, translate_text, random_number, text_length)


def register(registry: ToolRegistry) -> None:
    """Plugin entry point: register the eight built-in tools."""
    for tool in BUILTIN_TOOLS:
        registry.register(tool)
