"""Each lab's recorded experiment: one module per lab, run by :mod:`agentic_rl.records`.

The contract a module fulfils (``agentic_rl.experiments.gigpo`` is the example):

- ``ARMS``: arm name -> the config fields the arm changes (the lab's arms, in order);
- ``SEEDS``: how many seeds the record holds (from the lab's power computation; >= 8 for a
  comparison);
- ``REPLICATE``: the main arms, re-run live for one recorded seed in the lab (CI's check);
- ``CHECKED``: the metrics the live replicate is compared on (``FLOORS``: their resolutions,
  where not 0.01);
- ``train(seed, arms, *, profile, device, **overrides)``: the trained trainers of one seed, by
  arm, from shared warm starts, exactly as the lab's own cells would train them;
- ``measure(trainer, arm, seed)``: ``{"metrics": {name: number}, "curves": {name: [...]}}``,
  everything the lab prints, asserts or plots about that trainer.

The measurement code lives here, once: the runner and the lab's live replicate both call it.
"""
