"""Probes: the papers' measurements of client drift, computed inside the compiled round.

``make_round(..., probes=[...])`` (Python) or ``fljax --probes a,b --probe-args '{...}'`` (CLI);
each probe's metrics appear in the round's metrics, ``metrics.jsonl``, TensorBoard and
``fljax plot --metrics``. ``fljax.probes.base`` explains the interface (write your own); each
module's docstring gives the equation it computes and its cost.

=========================  =====================================================================
probe                      metrics (per round, or per evaluation for ``evaluate`` probes)
=========================  =====================================================================
pseudo_gradient_diversity  ``pseudo_gradient_diversity`` (feddyn-as-init Eq. (1))
cosine_previous            ``cosine_previous`` (cos with the client's previous update)
cosine_to(reference)       ``cosine_to_reference`` (Figure 1c exactly, two runs)
state_diversity            ``local_drift_diversity``, ``control_variate_diversity``, ...
gradient_dissimilarity     ``gradient_variance`` r(x), ``gradient_dissimilarity[_first|_max]``
train_evaluation           ``global_train_loss``, ``global_train_accuracy`` (evaluation)
all_model                  ``all_model/accuracy``, ``all_model/loss`` (evaluation)
divergence                 ``divergence_all`` (FedInit's Delta over all clients)
interaction_tensor         ``interaction_clusters``, ``interaction_*_shared`` (its rounds)
switching_criterion        ``switch_C``, ``switch_D``, ``switch_margin``, ``switch_condition``
=========================  =====================================================================
"""

from fljax.registry import BUILTIN_PROBES
from fljax.probes.base import (ClientView, EvalView, Population, Probe, RoundView, squared_norm,
                               stacked, tree_dot)
from fljax.probes.cosine import cosine_previous, cosine_to, last_pseudo_gradients
from fljax.probes.dissimilarity import gradient_dissimilarity
from fljax.probes.divergence import divergence
from fljax.probes.diversity import pseudo_gradient_diversity, state_diversity
from fljax.probes.evaluation import all_model, train_evaluation
from fljax.probes.interaction import interaction_tensor, interaction_tensor_of
from fljax.probes.switching import centralized_optimum, smoothness, switching_criterion

# Probes the CLI builds by name (``--probes``); their keyword arguments come from --probe-args.
# interaction_tensor, switching_criterion and cosine_to take experiment data; fljax.runner.experiment
# supplies it.
# fljax.registry lists their names (BUILTIN_PROBES); a user's probe is registered there.
PROBES = {name: globals()[name] for name in BUILTIN_PROBES}

__all__ = ["PROBES", "ClientView", "EvalView", "Population", "Probe", "RoundView",
           "all_model", "centralized_optimum", "cosine_previous", "cosine_to", "divergence",
           "gradient_dissimilarity", "interaction_tensor", "interaction_tensor_of",
           "last_pseudo_gradients", "pseudo_gradient_diversity", "smoothness", "squared_norm",
           "stacked", "state_diversity", "switching_criterion", "train_evaluation", "tree_dot"]
