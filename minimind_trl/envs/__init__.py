"""Tool-use environment pieces: safe tools, the tool registry, tool-call parsing.

Import the public names from `minimind_trl.envs.tools`; the TRL environment and the batched
rollout live in their own modules of this package.
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
