"""The experiment layer: configs, runs, sweeps, checkpoints, logs and the command line.

Modules:

- ``config``: ``ExperimentConfig`` (every option of a run, validated) and config files.
- ``arguments``: checking keyword arguments of algorithms, wrappers and probes by signature.
- ``experiment``: building a run's data, model, algorithm and round from a config.
- ``grouping``: which runs can share one compiled program (traced hyperparameters).
- ``train``: running, resuming and logging one run or many (``run``, ``run_many``).
- ``sweep``: a paper's table as rows x columns x seeds, the tuning rule and paired comparisons.
- ``hyperband``: early stopping of sweep grids (FedDecay's Hyperband).
- ``early_termination``: stopping a sweep grid's weak points at a fraction of the rounds (FedGA's B.2).
- ``checkpoint``: orbax checkpoints that a crash or Ctrl-C cannot corrupt.
- ``logs``: metrics.jsonl and TensorBoard.
- ``multihost``: many processes (``jax.distributed``) and stopping them together.
- ``cli``: the ``fljax`` command.
- ``plot``: curves from run directories.

Layer: the top; may import every other layer of fljax. Nothing below imports it.
"""
