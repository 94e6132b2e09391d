"""fljax: federated-learning research in JAX, one compiled XLA program per communication round.

Every algorithm and wrapper is a top-level name, as optax exposes its transforms::

    import fljax
    algorithm = fljax.feddyn(fljax.local_sgd(0.1), alpha=0.01)
    algorithm = fljax.switch(algorithm, fljax.fedavg(fljax.local_sgd(0.1)), at_round=150)
    round_fn = fljax.make_round(algorithm, model, data, clients_per_round=10, batch_size=50,
                                local_epochs=5)

``help(fljax.Algorithm)`` explains the algorithm interface (write your own in a few lines),
``help(fljax.make_round)`` the round, ``help(fljax.probes)`` the in-round measurements.
"""

from fljax.algorithms import (Algorithm, ClientContext, LocalSGD, fedadagrad, fedadam, fedavg,
                              fedavgm, fedcm, feddecay, feddecorr, feddyn, fedexp, fedga, fedinit,
                              fednova, fedntd, fedprox, fedsam, fedsgd, fedyogi, fomaml, gradalign,
                              gradual_unfreezing, lbsgd, local_decay, local_sgd, moon,
                              relaxed_init, reptile, scaffold, switch)
from fljax.config import ExperimentConfig, load_config
from fljax.data import FederatedData, federate, load_dataset
from fljax.engine import RoundFunction, RoundState, init_state, make_round, sample_cohort
from fljax.errors import FljaxError
from fljax.evaluate import make_evaluator
from fljax.experiment import Experiment, build
from fljax.models import Model, from_module, make_model
from fljax.train import results_table, run
from fljax import probes

__version__ = "0.1.0"

ALGORITHM_NAMES = ["fedadagrad", "fedadam", "fedavg", "fedavgm", "fedcm", "feddecay", "feddecorr",
                   "feddyn", "fedexp", "fedga", "fedinit", "fednova", "fedntd", "fedprox",
                   "fedsam", "fedsgd", "fedyogi", "fomaml", "gradalign", "lbsgd", "moon",
                   "reptile", "scaffold"]
WRAPPER_NAMES = ["gradual_unfreezing", "local_decay", "relaxed_init", "switch"]

__all__ = ["Algorithm", "ClientContext", "Experiment", "ExperimentConfig", "FederatedData",
           "FljaxError", "LocalSGD", "Model", "RoundFunction", "RoundState", "build", "federate",
           "from_module", "init_state", "load_config", "load_dataset", "local_sgd",
           "make_evaluator", "make_model", "make_round", "results_table", "run",
           "sample_cohort"] + ALGORITHM_NAMES + WRAPPER_NAMES
