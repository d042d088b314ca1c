"""Example third-party tool plugin: compound interest.

Load it by file path, as any plugin (`minimind_trl.envs.tools`)::

    registry = default_registry(plugins=["plugins/example_tool.py"])           # via TOOLS
    load_tool_plugin(registry, "plugins/example_tool.py:compound_interest")    # one function

or name it in a recipe: ``rollout.tools: ["plugins/example_tool.py"]``; the run's rewards that
judge tool calls (``minimind_agent_reward``) then count ``compound_interest`` as a valid tool.

A tool is a typed function with a Google-style docstring (that becomes its schema); it bounds
its own work and raises `ToolError` for a bad request, which the registry reports as an
``{"error": ...}`` observation.
"""

import math

from minimind_trl.envs.registry import ToolError

MAX_YEARS = 1000
MAX_PERIODS_PER_YEAR = 365
MAX_AMOUNT = 1e18


def compound_interest(principal: float, annual_rate_percent: float, years: int,
                      periods_per_year: int = 1) -> float:
    """Final amount of a deposit with compound interest: P · (1 + r / (100·n))^(n·t).

    Args:
        principal: The amount deposited, P.
        annual_rate_percent: The yearly interest rate in percent, r (5 means 5%).
        years: The number of years, t.
        periods_per_year: How many times a year interest is added, n (1 = yearly, 12 = monthly).
    """
    if principal < 0 or not 0 <= years <= MAX_YEARS:
        raise ToolError(f"principal must be >= 0 and years between 0 and {MAX_YEARS}")
    if not 1 <= periods_per_year <= MAX_PERIODS_PER_YEAR:
        raise ToolError(f"periods_per_year must be between 1 and {MAX_PERIODS_PER_YEAR}")
    growth = 1 + annual_rate_percent / (100 * periods_per_year)
    if growth <= 0:
        raise ToolError("the rate must be above -100% per period")
    log_amount = math.log(principal) + periods_per_year * years * math.log(growth) \
        if principal > 0 else -math.inf
    if log_amount > math.log(MAX_AMOUNT):
        raise ToolError("the amount exceeds 1e18")
    return principal * growth ** (periods_per_year * years)


TOOLS = [compound_interest]
