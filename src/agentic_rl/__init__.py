"""agentic_rl: the package behind the executable textbook on reinforcement learning for LLM agents.

Modules follow the data path of the book: ``envs`` (tasks) -> ``rollout`` (Batch) -> ``advantages``
-> ``losses`` -> ``train`` (SFT and GRPO loops) -> ``plotting``.
"""

__version__ = "0.1.0"
