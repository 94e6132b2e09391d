"""The compiled round: one pure function over a pytree state, from the sampled cohort to the
server update.

Modules:

- ``engine``: ``make_round`` and ``init_state`` (the round program: the synchronous round, the
  asynchronous step, timing and batched runs composed into one jit-compiled function).
- ``clients``: a client's local training (a ``lax.scan`` over its local steps).
- ``placement``: where the population and the cohort live (one device, or sharded over a mesh).
- ``runs``: many runs of one program side by side (stacked states and traced hyperparameters).
- ``asynchronous``: the asynchronous step (FedBuff, FedAsync) on a client clock.
- ``personalize``: local fine-tuning and evaluation of personalized models.

Layer: may import ``fljax.errors``, ``fljax.hyperparams``, ``fljax.registry``,
``fljax.fielddocs``, ``fljax.accounting``, ``fljax.data``, ``fljax.models``,
``fljax.compression``, ``fljax.robustness``, ``fljax.population``, ``fljax.algorithms`` and
``fljax.probes``; never ``fljax.runner``.
"""
