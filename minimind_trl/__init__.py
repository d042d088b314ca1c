"""minimind-trl: a white-box online RL post-training lab for MiniMind models on TRL.

Importing the package registers the MiniMind config and model with transformers' Auto classes
(``AutoConfig`` / ``AutoModelForCausalLM`` for ``model_type="minimind"``).
"""

__version__ = "0.1.0"

from minimind_trl import modeling as _modeling  # noqa: F401,E402  (registers the Auto classes)
