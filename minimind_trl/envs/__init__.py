"""Tool-use environment pieces: safe tools, the tool registry, tool-call parsing.

Import the public names from `minimind_trl.envs.tools`. The token/observation protocol that
training and evaluation share is `minimind_trl.envs.protocol`; the TRL environment
(`environment`) and the batched evaluation rollout (`rollout`) build on it, in that order
(``rollout -> environment -> protocol -> parsing``).
"""

from minimind_trl.envs.tools import (  # noqa: F401
    EXCHANGE_RATES,
    UNIT_FACTORS,
    ToolCallParse,
    ToolError,
    ToolRegistry,
    default_registry,
    format_number,
    parse_tool_calls,
)
