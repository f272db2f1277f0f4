"""agentic_rl: the package behind the executable textbook on reinforcement learning for LLM agents.

The data path: ``envs`` (tasks, environments) -> ``rollout`` / ``multiturn`` (a ``Batch``) ->
``advantages`` -> ``filters`` -> ``losses`` -> ``train`` (the loop) -> ``plotting``.

Each chapter is one module, which holds its recipe's config and trainer (``cli.RECIPES``):

==========================  ========================================================
chapter                     module
==========================  ========================================================
GRPO                        ``grpo`` (``GRPOConfig``, ``GRPOTrainer``)
GAE and PPO with a critic   ``agent`` (``PPOConfig``, ``AgentTrainer``)
ReTool                      ``retool`` (+ ``sandbox``, ``envs.MultiplyEnv``)
RAGEN's StarPO              ``starpo`` (+ ``filters``)
RC-GRPO                     ``rcgrpo`` (+ ``envs.FileSystemEnv``)
GCD                         ``gcd`` (+ ``coupling``, ``envs.HouseholdEnv``)
GiGPO                       ``gigpo``
Early Experience            ``early_experience``
==========================  ========================================================

Around them: ``config`` (shared fields), ``runs`` (preflight, a run, a lab's arms),
``checkpoint`` (+ ``outdir``: the output folder), ``distributed`` (torchrun), ``models``,
``utils`` (seeds), and the learner tools ``check`` and ``tokenview``.
"""

__version__ = "0.1.0"
