"""Question and answer wording for generated agent-math tasks, in Chinese (``zh``) and English (``en``).

Wording rules that keep :func:`minimind_trl.data.strata.infer_op_type` in agreement with the
generator (a test checks it): only chain questions use step words (then / the result / 然后 / 结果);
unit questions always say convert / 换算 / 转换 / 折合; percentage questions hold ``%`` or
"percent" / 百分之; power questions hold ``^``, "power", "squared", "cubed" or 次方 / 平方 / 立方;
plain arithmetic holds none of these.
"""

from __future__ import annotations

SYSTEM_PROMPTS = {
    "zh": ("你是一个严谨的数学助手。每一步计算都请调用提供的工具，最后用中文给出所有数值。",
           "你可以使用下面列出的工具。遇到计算时先调用工具，再根据工具返回的数值作答。"),
    "en": ("You are a careful math assistant. Use the provided tools for every calculation and "
           "state every number you obtained in the final answer.",
           "You can call the tools listed below. Call a tool for each calculation, then answer "
           "with the values the tools returned."),
}

# one sub-question each; {expr} shows the expression, {a}/{b} operands
ARITHMETIC = {
    "zh": ("计算 {expr} 的值。", "{expr} 等于多少?", "请帮我算一下 {expr}。", "求 {expr}。"),
    "en": ("Calculate {expr}.", "What is {expr}?", "Please work out {expr}.", "Evaluate {expr} for me."),
}
ARITHMETIC_WORDS = {  # easy two-operand questions in words
    "zh": {"+": "{a} 加 {b} 等于多少?", "-": "{a} 减去 {b} 是多少?", "*": "{a} 乘以 {b} 等于几?",
           "/": "{a} 除以 {b} 是多少?"},
    "en": {"+": "What is {a} plus {b}?", "-": "What is {a} minus {b}?", "*": "How much is {a} times {b}?",
           "/": "What is {a} divided by {b}?"},
}
PERCENTAGE = {
    "of": {"zh": ("{x} 的 {p}% 是多少?", "算一下 {x} 的 {p}%。"),
           "en": ("What is {p}% of {x}?", "Find {p}% of {x}.")},
    "up": {"zh": ("{x} 增加 {p}% 后是多少?", "把 {x} 提高 {p}%,会变成多少?"),
           "en": ("What is {x} increased by {p}%?", "Raise {x} by {p}%. What do you get?")},
    "down": {"zh": ("{x} 减少 {p}% 后是多少?", "{x} 降低 {p}% 以后是多少?"),
             "en": ("What is {x} decreased by {p}%?", "Reduce {x} by {p}%. What is left?")},
    "ratio": {"zh": ("{a} 占 {b} 的百分之几?",),
              "en": ("What percentage of {b} is {a}?", "{a} is what percent of {b}?")},
}
POWER = {
    2: {"zh": ("{a} 的平方是多少?",), "en": ("What is {a} squared?",)},
    3: {"zh": ("{a} 的立方是多少?",), "en": ("What is {a} cubed?",)},
    "n": {"zh": ("{a} 的 {b} 次方等于多少?", "计算 {a} 的 {b} 次方。"),
          "en": ("What is {a} to the power of {b}?", "Compute {a} raised to the power {b}.")},
    "expr": {"zh": ("计算 {expr}(^ 表示乘方)。",), "en": ("Evaluate {expr}, where ^ means power.",)},
}
UNIT = {
    "zh": ("把 {v} {src}换算成{dst}。", "{v} {src}折合多少{dst}?", "将 {v} {src}转换为{dst}是多少?"),
    "en": ("Convert {v} {src} to {dst}.", "What is {v} {src} when converted to {dst}?",
           "Please convert {v} {src} into {dst}."),
}
EXCHANGE = {
    "zh": ("{src}兑{dst}的汇率是多少?", "查一下{src}到{dst}的汇率。", "1 {src}能换多少{dst}?请查询汇率。",
           "现在{src}对{dst}的汇率是多少?", "请告诉我{src}换成{dst}的汇率。"),
    "en": ("What is the exchange rate from {src} to {dst}?", "Look up the {src} to {dst} exchange rate.",
           "How many {dst} does 1 {src} buy at the current exchange rate?",
           "I need the {src}/{dst} exchange rate.", "Tell me the exchange rate for converting {src} into {dst}."),
}

# joining independent sub-questions: {parts} are numbered by the template's own markers
MULTI = {
    "zh": (("请分别回答:", "1) {q}", " 2) {q}", " 3) {q}"), ("帮我算{n}个问题。", "第一,{q}", " 第二,{q}", " 第三,{q}"),
           ("", "{q}", " 另外,{q}", " 还有,{q}")),
    "en": (("Please answer each of these:", " 1) {q}", " 2) {q}", " 3) {q}"),
           ("I need {n} numbers.", " (a) {q}", " (b) {q}", " (c) {q}"), ("", "{q}", " Also: {q}", " And: {q}")),
}
NUMBER_WORDS = {"zh": {2: "两", 3: "三"}, "en": {2: "two", 3: "three"}}

# chains: the first step's phrase, then step phrases acting on the previous result
CHAIN_START = {
    "calc": {"zh": "先计算 {expr}", "en": "First work out {expr}"},
    "power": {"zh": "先算出 {a} 的 {b} 次方", "en": "First compute {a} to the power of {b}"},
    "unit": {"zh": "先把 {v} {src}换算成{dst}", "en": "First convert {v} {src} to {dst}"},
    "exchange": {"zh": "先查询{src}兑{dst}的汇率", "en": "First look up the {src} to {dst} exchange rate"},
}
CHAIN_STEP = {
    "+": {"zh": "把结果加上 {c}", "en": "add {c} to the result"},
    "-": {"zh": "把结果减去 {c}", "en": "subtract {c} from the result"},
    "*": {"zh": "把结果乘以 {c}", "en": "multiply the result by {c}"},
    "/": {"zh": "把结果除以 {c}", "en": "divide the result by {c}"},
    "pct": {"zh": "求结果的 {c}%", "en": "take {c}% of the result"},
    "amount": {"zh": "用这个汇率把 {c} {src}换算成{dst}", "en": "use that rate to convert {c} {src} into {dst}"},
}
CHAIN_JOIN = {
    "zh": (("{s1},然后{s2}", ",接着{s3}", "。"), ("请{s1},然后{s2}", ",最后{s3}", "。每一步的结果都告诉我。")),
    "en": (("{s1}, then {s2}", ", and then {s3}", "."),
           ("{s1}. Then {s2}", ". Then {s3}", ". Report the result of every step.")),
}

# final answers: {items} are per-call phrases such as "12 + 30 = 42"
FINAL_SINGLE = {"zh": ("计算完成:{items}。", "答案:{items}。"), "en": ("The answer: {items}.", "Result: {items}.")}
FINAL_MULTI = {"zh": ("各题答案如下:{items}。",), "en": ("Here are the answers: {items}.",)}
FINAL_CHAIN = {"zh": ("逐步计算:{items}。最终答案是 {last}。",),
               "en": ("Step by step: {items}. The final answer is {last}.",)}
ITEM_SEPARATOR = {"zh": ";", "en": "; "}

UNIT_NAMES = {
    "zh": {"m": "米", "km": "公里", "cm": "厘米", "mm": "毫米", "mile": "英里", "ft": "英尺", "in": "英寸",
           "kg": "千克", "g": "克", "t": "吨", "lb": "磅", "jin": "斤", "s": "秒", "min": "分钟",
           "h": "小时", "day": "天", "week": "周", "l": "升", "ml": "毫升", "m2": "平方米", "ha": "公顷",
           "km2": "平方公里", "m/s": "米/秒", "km/h": "公里/小时", "celsius": "摄氏度",
           "fahrenheit": "华氏度", "kelvin": "开尔文"},
    "en": {"m": "meters", "km": "km", "cm": "cm", "mm": "mm", "mile": "miles", "ft": "feet",
           "in": "inches", "kg": "kg", "g": "grams", "t": "tonnes", "lb": "pounds", "jin": "jin",
           "s": "seconds", "min": "minutes", "h": "hours", "day": "days", "week": "weeks",
           "l": "liters", "ml": "ml", "m2": "square meters", "ha": "hectares", "km2": "km2",
           "m/s": "m/s", "km/h": "km/h", "celsius": "degrees Celsius",
           "fahrenheit": "degrees Fahrenheit", "kelvin": "kelvin"},
}
CURRENCY_NAMES_ZH = {"CNY": "人民币", "USD": "美元", "EUR": "欧元", "GBP": "英镑", "JPY": "日元",
                     "HKD": "港币", "AUD": "澳元", "CAD": "加元", "SGD": "新加坡元", "CHF": "瑞士法郎",
                     "KRW": "韩元"}
