"""FedSAM: FedAvg whose clients take sharpness-aware (SAM) local steps.

Qu et al., "Generalized Federated Learning via Sharpness Aware Minimization", ICML 2022;
Caldarola, Caputo, Ciccone, "Improving Generalization in Federated Learning by Seeking Flat
Minima", ECCV 2022 (official ``debcaldarola/fedsam``, ``models/clients/minimizers.py``; Qu et al.'s
version as coded in ``woodenchild95/FL-Simulator``, ``optimizer/ESAM.py``, ``client/fedsam.py``).

Local step at y on a batch with loss L (the base local optimizer does the rest):

    g   = grad L(y)
    e   = rho * g / (||g|| + eps)            ||.|| the global norm over all parameters
    g~  = grad L(y + e)                      the SAM gradient
    y  <- base SGD step on g~                (clip, + weight decay, momentum, as ``LocalSGD``)

Weight decay is not in the perturbation (it is added by the optimizer, after the loss gradient),
and clipping acts on g~, as in FLSIM (CALD does not clip). The server is FedAvg (any
``server_optimizer``).

Implementation: a ``client_loss`` wrapper whose gradient is g~. With e(y) held constant,

    L_sam(y) = L(y + stop_gradient(e(y))) - stop_gradient(L(y + e)) + stop_gradient(L(y))

has value L(y) (the reported train loss is the unperturbed one, as in CALD/FLSIM) and gradient
grad L evaluated at y + e: the chain rule through y + const is the identity. Both passes use the
same dropout key (torch draws two masks). ``rho = 0`` gives e = 0 and FedAvg exactly.

Defaults: rho = 0.1 (CALD's and FLSIM's scripts; DECORR's SAM uses 0.05), eps = 1e-12 (DECORR's
davda54 SAM); ``eps=1e-7`` is FLSIM's and ``eps=1e-16`` CALD's. Not implemented: ASAM (CALD's
adaptive variant) and MoFedSAM (FLSIM's FedCM mixing).
"""

from __future__ import annotations

import jax
import optax

from fljax.algorithms.base import Algorithm, ClientContext, ClientOptimizer, LocalSGD, LossFn
from fljax.algorithms.fedavg import fedavg
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check


def sam_loss(loss_fn: LossFn, rho: float, eps: float) -> LossFn:
    """``loss_fn`` with value L(y) and gradient grad L(y + rho g/(||g|| + eps)), g = grad L(y)."""

    def loss(params, *args):
        value, grads = jax.value_and_grad(loss_fn)(params, *args)
        norm = optax.tree.norm(grads)
        perturbed = jax.tree.map(
            lambda p, g: p + jax.lax.stop_gradient(rho * g / (norm + eps)).astype(p.dtype),
            params, grads)
        at_perturbed = loss_fn(perturbed, *args)
        return at_perturbed - jax.lax.stop_gradient(at_perturbed) + jax.lax.stop_gradient(value)

    return loss


def fedsam(local: LocalSGD | optax.GradientTransformation | ClientOptimizer, *, rho: float = 0.1,
           eps: float = 1e-12, server_optimizer: optax.GradientTransformation | None = None
           ) -> Algorithm:
    """FedAvg with SAM local steps of radius ``rho`` (wraps the model's loss: needs no model)."""
    check("rho", rho, NON_NEGATIVE, "a finite number >= 0")
    check("eps", eps, POSITIVE, "a finite number > 0")

    def client_loss(ctx: ClientContext, loss_fn: LossFn) -> LossFn:
        del ctx
        return sam_loss(loss_fn, rho, eps)

    return fedavg(local, server_optimizer, name="fedsam")._replace(client_loss=client_loss)
