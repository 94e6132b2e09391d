"""fljax: federated-learning research in JAX, one compiled XLA program per communication round."""

from fljax.algorithms import Algorithm, ClientContext, fedavg, fedsgd, local_sgd
from fljax.config import ExperimentConfig, load_config
from fljax.data import FederatedData, federate, load_dataset
from fljax.engine import RoundFunction, RoundState, init_state, make_round, sample_cohort
from fljax.errors import FljaxError
from fljax.evaluate import make_evaluator
from fljax.experiment import Experiment, build
from fljax.models import Model, make_model
from fljax.train import results_table, run

__version__ = "0.1.0"

__all__ = ["Algorithm", "ClientContext", "Experiment", "ExperimentConfig", "FederatedData",
           "FljaxError", "Model", "RoundFunction", "RoundState", "build", "federate", "fedavg",
           "fedsgd", "init_state", "load_config", "load_dataset", "local_sgd", "make_evaluator",
           "make_model", "make_round", "results_table", "run", "sample_cohort"]
