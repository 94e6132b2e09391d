"""The compiled round: one pure function over a pytree state, from the sampled cohort to the
server update.

Modules:

- ``engine``: ``make_round``, ``init_state``, ``RoundState`` and ``RoundFunction``: the parts below
  composed into one jit-compiled function.
- ``plan``: ``make_round``'s arguments checked and resolved into a ``RoundPlan``.
- ``synchronous``: the synchronous round (sample, train, aggregate, server update, observe).
- ``asynchronous``: the asynchronous server step (FedBuff, FedAsync) on a client clock.
- ``cohort_training``: a cohort's local work: chunked, side by side, or dealt over devices.
- ``clients``: a client's local training (a ``lax.scan`` over its local steps).
- ``placement``: where the population and the cohort live (one device, or sharded over a mesh).
- ``runs``: many runs of one program (stacked states, traced hyperparameters, ``batch_runs``).
- ``personalize``: local fine-tuning and evaluation of personalized models.

Layer: may import ``fljax.errors``, ``fljax.hyperparams``, ``fljax.registry``,
``fljax.fielddocs``, ``fljax.accounting``, ``fljax.data``, ``fljax.models``,
``fljax.compression``, ``fljax.robustness``, ``fljax.population``, ``fljax.algorithms`` and
``fljax.probes``; never ``fljax.runner``.
"""
