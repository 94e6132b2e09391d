"""Who takes part in a round, and when their work arrives.

Modules:

- ``cohort``: a round's cohort, its aggregation weights and every client's keys (all drawn from
  the round's key, so a resumed run samples what an uninterrupted one does).
- ``clock``: simulated client time (compute and network speeds, per-client clocks).
- ``stragglers``: deadlines and what a late client's work counts for.

Layer: may import ``fljax.errors`` and ``fljax.hyperparams`` only; the round program
(``fljax.core``) and the runner import it.
"""
