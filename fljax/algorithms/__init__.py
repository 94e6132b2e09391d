"""Federated algorithms: NamedTuples of pure functions built by factories, one module each.

Every hyperparameter that does not change a shape (learning rates, decays, momentum, weight decay,
clip norm, server numbers, mu, alpha, beta, tau, rho, lambda, FedBug's fraction, the switch round)
may be a scalar array, traced too, so one compiled program serves many values
(``fljax.hyperparams``). Structural, and so Python values: strings and bools (options, schedules,
orders), None against a number (``clip_norm``, ``inner_lr``, ``personal_lr``), integer counts
(``inner_steps``, ``num_components``, ``frozen_last``, ``prev_seed``), parameter groups and masks,
and schedules given as functions.
"""

from fljax.algorithms.base import (Algorithm, ClientContext, ClientOptimizer, CohortMessages,
                                   LocalSGD,
                                   as_client_optimizer,
                                   identity_loss, identity_start, local_sgd, no_client_state,
                                   tree_scale, tree_sub)
from fljax.algorithms.byzantine import byzantine
from fljax.algorithms.compress import compress
from fljax.algorithms.ditto import ditto
from fljax.algorithms.dp import dp
from fljax.algorithms.fedavg import fedavg, fedsgd
from fljax.algorithms.fedbug import gradual_unfreezing
from fljax.algorithms.fedcm import fedcm
from fljax.algorithms.feddecorr import feddecorr
from fljax.algorithms.feddecay import feddecay, local_decay
from fljax.algorithms.feddyn import feddyn
from fljax.algorithms.fedem import fedem
from fljax.algorithms.fedexp import fedexp
from fljax.algorithms.fedga import fedga, gradalign, lbsgd
from fljax.algorithms.fedinit import fedinit, relaxed_init
from fljax.algorithms.fednova import fednova
from fljax.algorithms.fedpaq import fedpaq
from fljax.algorithms.local_layers import fedbn, local_layers
from fljax.algorithms.fedntd import fedntd
from fljax.algorithms.fedprox import fedprox
from fljax.algorithms.fedsam import fedsam
from fljax.algorithms.meta import fomaml, reptile
from fljax.algorithms.moon import moon
from fljax.algorithms.pfedme import pfedme
from fljax.algorithms.robust import robust
from fljax.algorithms.scaffold import scaffold
from fljax.algorithms.server_optimizers import (fedadagrad, fedadagrad_server, fedadam,
                                                fedadam_server, fedavgm, fedyogi, fedyogi_server)
from fljax.algorithms.switch import switch

__all__ = ["Algorithm", "ClientContext", "ClientOptimizer", "CohortMessages", "LocalSGD", "as_client_optimizer",
           "byzantine", "compress", "ditto", "dp", "fedadagrad", "fedadagrad_server", "fedadam", "fedadam_server", "fedavg",
           "fedavgm", "fedbn", "fedcm", "feddecay", "feddecorr", "feddyn", "fedem", "fedexp",
           "fedga", "fedinit", "fednova", "fedpaq",
           "fedntd", "fedprox", "fedsam", "fedsgd", "fedyogi", "fedyogi_server", "fomaml",
           "gradalign", "gradual_unfreezing", "identity_loss", "identity_start", "lbsgd",
           "local_decay", "local_layers", "local_sgd", "moon", "no_client_state", "pfedme",
           "relaxed_init", "reptile", "robust",
           "scaffold", "switch", "tree_scale", "tree_sub"]
