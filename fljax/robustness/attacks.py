"""Byzantine attacks: what Byzantine clients send in place of their honest update.

Every model-poisoning attack is a pure function of the round's stacked client messages::

    x          [m, d] float   one flattened (unweighted) update per cohort slot
    mask       [m] bool       the slots that hold a real client (the others hold padding)
    byzantine  [m] bool       the real slots whose client is Byzantine

and returns the full new stack [m, d]: each real Byzantine row replaced by the attack vector, every
other row (honest or padding) returned unchanged. The honest rows are ``mask & ~byzantine``; their
number h may be traced, so statistics are masked sums, and a padding row never enters them, even
when it holds inf or NaN. With no honest row in the round, the honest statistics are zero vectors.
All functions are jit- and vmap-able; their scalar parameters (``sigma``, ``epsilon``, ``z``,
``num_byzantine``, ``target``) may be traced.

The omniscient attacks (``sign_flip``, ``alie``, ``inner_product_manipulation``, ``mimic``) see the
honest updates of the round, as in the papers' and ByzFL's experiments. ``flip_labels`` is data
poisoning: the Byzantine client trains on flipped labels and sends its update unchanged.
``byzantine_ids`` picks which clients of the population are Byzantine.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import jax
import jax.numpy as jnp

from fljax.errors import FljaxError


def _honest(mask: jax.Array, byzantine: jax.Array) -> jax.Array:
    return mask & ~byzantine


def _replace_byzantine(x: jax.Array, mask: jax.Array, byzantine: jax.Array,
                       attack: jax.Array) -> jax.Array:
    """``x`` with each real Byzantine row replaced by ``attack`` ([d], or [m, d] row by row)."""
    return jnp.where((mask & byzantine)[:, None], jnp.broadcast_to(attack, x.shape), x)


def _honest_count(honest: jax.Array, dtype) -> jax.Array:
    return jnp.sum(honest).astype(dtype)


def _honest_mean(x: jax.Array, honest: jax.Array) -> jax.Array:
    """Mean of the honest rows; zeros if there are none. Other rows never enter (not even NaN)."""
    total = jnp.sum(jnp.where(honest[:, None], x, 0), axis=0)
    return total / jnp.maximum(_honest_count(honest, x.dtype), 1)


def _honest_std(x: jax.Array, honest: jax.Array, mean: jax.Array, ddof: int) -> jax.Array:
    """Coordinate-wise standard deviation of the honest rows, sqrt(sum (x_i - mean)^2 / (h - ddof));
    zeros if h <= ddof."""
    squares = jnp.sum(jnp.where(honest[:, None], jnp.square(x - mean), 0), axis=0)
    return jnp.sqrt(squares / jnp.maximum(_honest_count(honest, x.dtype) - ddof, 1))


def sign_flip(x: jax.Array, mask: jax.Array, byzantine: jax.Array, *,
              own: bool = False) -> jax.Array:
    r"""Sign flipping: every Byzantine row sends the negative of the honest mean,

    .. math::  b = -\frac{1}{h} \sum_{i \in H} x_i,

    the definition of ByzFL's ``SignFlipping`` (the EPFL ByzFL library), which cites Allen-Zhu,
    Ebrahimian, Li, Alistarh, "Byzantine-Resilient Non-Convex Stochastic Gradient Descent",
    ICLR 2021. It is the default so that all omniscient attacks here share one input: the honest
    rows.

    The papers flip the Byzantine client's *own* update instead, :math:`b_j = -x_j`: Allen-Zhu et
    al.'s sign-flipping attack and the "bit-flipping" attack of Karimireddy, He, Jaggi, "Learning
    from History for Byzantine Robust Optimization", ICML 2021 and "Byzantine-Robust Learning on
    Heterogeneous Datasets via Bucketing", ICLR 2022 (their code negates the worker's own gradient;
    Blades' ``SignFlipAdversary`` does the same). ``own=True`` gives that definition: each
    Byzantine row is its own (honestly computed) row, negated. ``own`` is static.
    """
    attack = -x if own else -_honest_mean(x, _honest(mask, byzantine))
    return _replace_byzantine(x, mask, byzantine, attack)


def gaussian(x: jax.Array, mask: jax.Array, byzantine: jax.Array, key: jax.Array,
             sigma) -> jax.Array:
    r"""Gaussian attack: every Byzantine row is an independent draw,
    :math:`b_j \sim N(0, \sigma^2 I_d)`.

    Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017 (their "Gaussian Byzantine workers", sigma = 200).
    Zero mean as in the paper (ByzFL's ``Gaussian`` adds an optional mean mu; it is 0 here). The
    draw does not depend on the honest rows. Row j's draw is row j of one ``normal(key, [m, d])``.
    """
    noise = jax.random.normal(key, x.shape, x.dtype) * jnp.asarray(sigma, x.dtype)
    return _replace_byzantine(x, mask, byzantine, noise)


def _support_probability(n, f):
    """(p, valid) of ALIE's z: s = floor(n/2 + 1) - f supporters, p = (n - f - s) / (n - f)."""
    supporters = jnp.floor(n / 2 + 1) - f
    p = (n - f - supporters) / jnp.maximum(n - f, 1)
    return p, (n - f >= 1) & (p > 0) & (p < 1)


def alie_z(n: int, f: int) -> float:
    r"""ALIE's default z for n clients of which f are Byzantine (static; float64, no SciPy):

    .. math::  s = \lfloor n/2 + 1 \rfloor - f, \qquad
               z = \Phi^{-1}\Big(\frac{n - f - s}{n - f}\Big).

    Where the formula has no finite value (a Byzantine majority, s <= 0, or p = 0 when too few
    honest clients remain to give support) z is 0: the Byzantine rows then send the honest mean.
    ``alie`` computes the same value in the graph from traced n and f.
    """
    supporters = math.floor(n / 2 + 1) - f
    if n - f < 1:
        return 0.0
    p = (n - f - supporters) / (n - f)
    return NormalDist().inv_cdf(p) if 0 < p < 1 else 0.0


def alie(x: jax.Array, mask: jax.Array, byzantine: jax.Array, z=None, num_byzantine=None, *,
         ddof: int = 0) -> jax.Array:
    r"""A Little Is Enough: every Byzantine row is the honest mean shifted by z standard deviations,

    .. math::  b = \mu - z \sigma, \qquad \mu_k = \frac{1}{h} \sum_{i \in H} x_{ik}, \quad
               \sigma_k = \sqrt{\frac{1}{h - \mathrm{ddof}} \sum_{i \in H} (x_{ik} - \mu_k)^2}.

    Baruch, Baruch, Goldberg, "A Little Is Enough: Circumventing Defenses For Distributed
    Learning", NeurIPS 2019.

    - sigma: population standard deviation (``ddof=0``) by default, as the paper's official code
      (``np.var(...) ** 0.5`` in its ``DriftAttack``). Karimireddy et al.'s code (``torch.std``)
      and ByzFL's ``ALittleIsEnough`` use the sample standard deviation: pass ``ddof=1`` (static).
    - mu, sigma are over the round's honest rows (the omniscient variant of Karimireddy et al. and
      ByzFL); the paper's attackers estimate them from their own clients' honest updates.
    - z: ``None`` gives the paper's z_max from n, the number of real clients in the round, and f,
      ``num_byzantine`` if given (traced allowed) else the round's number of Byzantine clients:
      :math:`s = \lfloor n/2+1 \rfloor - f`, :math:`z = \Phi^{-1}((n - f - s)/(n - f))` (see
      ``alie_z``). This is the form of Karimireddy et al.'s code (the fraction of the n - f
      honest clients that must lie beyond the attack vector); the paper's Algorithm 1 writes the
      condition over all n workers, :math:`\Phi(z) < (n - s)/n`. ByzFL's ``ALittleIsEnough``
      instead takes a fixed factor tau (default 1.5) and sends :math:`\mu + \tau\sigma`: pass
      ``z=-tau`` for it. In-graph, the undefined cases give z = 0, as ``alie_z`` documents.
    """
    honest = _honest(mask, byzantine)
    mean = _honest_mean(x, honest)
    std = _honest_std(x, honest, mean, ddof)
    if z is None:
        n = jnp.sum(mask).astype(x.dtype)
        f = jnp.sum(mask & byzantine) if num_byzantine is None else num_byzantine
        f = jnp.asarray(f).astype(x.dtype)
        p, valid = _support_probability(n, f)
        z = jnp.where(valid, jax.scipy.special.ndtri(jnp.where(valid, p, 0.5)), 0)
    return _replace_byzantine(x, mask, byzantine, mean - jnp.asarray(z, x.dtype) * std)


def inner_product_manipulation(x: jax.Array, mask: jax.Array, byzantine: jax.Array,
                               epsilon) -> jax.Array:
    r"""Inner product manipulation (IPM): every Byzantine row is :math:`b = -\epsilon \mu`, mu the
    honest mean.

    Xie, Koyejo, Gupta, "Fall of Empires: Breaking Byzantine-tolerant SGD by Inner Product
    Manipulation", UAI 2020. The same definition in ByzFL (``InnerProductManipulation``, tau) and
    Karimireddy et al.'s code.
    """
    attack = -jnp.asarray(epsilon, x.dtype) * _honest_mean(x, _honest(mask, byzantine))
    return _replace_byzantine(x, mask, byzantine, attack)


def mimic(x: jax.Array, mask: jax.Array, byzantine: jax.Array, target=0) -> jax.Array:
    r"""Mimic: every Byzantine row copies one honest client's update, :math:`b = x_t`.

    Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing",
    ICLR 2022. ``target`` is the index among the round's honest rows (0: the first honest slot,
    1: the second, ...; clipped to the last), the convention of ByzFL's ``Mimic(epsilon)``; it may
    be traced. With no honest row the Byzantine rows are zeros.

    The paper picks the target in a warm-up phase over the first rounds (``mimic_warmup``, whose
    state across rounds the ``byzantine`` wrapper keeps); here the caller chooses it.
    """
    honest = _honest(mask, byzantine)
    rank = jnp.cumsum(honest) - 1                   # honest row i is the rank[i]-th honest row
    last = jnp.maximum(jnp.sum(honest) - 1, 0)
    chosen = honest & (rank == jnp.clip(jnp.asarray(target), 0, last))
    attack = jnp.sum(jnp.where(chosen[:, None], x, 0), axis=0)
    return _replace_byzantine(x, mask, byzantine, attack)


def mimic_warmup(x: jax.Array, honest: jax.Array, mu: jax.Array, z: jax.Array, seen):
    r"""One warm-up round of the mimic attack: who to copy, by the direction of largest variance.

    Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing",
    ICLR 2022: the mimic attack's warm-up as their code's ``MimicVariantAttacker`` runs it.
    With t = ``seen`` warm-up rounds before this one, a = t / (t + 1), the honest rows u_i and
    their mean \bar u:

    .. math::

        \mu \leftarrow a \mu + (1 - a) \bar u, \qquad
        c = \sum_{i\ \mathrm{honest}} \langle u_i - \mu, z \rangle (u_i - \mu), \qquad
        z \leftarrow \frac{a z + (1 - a)\, c / \lVert c \rVert}
                          {\lVert a z + (1 - a)\, c / \lVert c \rVert \rVert}

    (at t = 0, mu is the round's honest mean and z one power-iteration step from the random start
    ``z``); the target is the honest slot argmax_i <u_i, z>. A zero c (one honest row, or all
    equal) leaves z as it was. Returns (mu, z, the target's slot); with no honest row, slot 0
    (``mimic`` then sends zeros).
    """
    a = jnp.asarray(seen, x.dtype) / (jnp.asarray(seen, x.dtype) + 1)
    mu = a * mu + (1 - a) * _honest_mean(x, honest)
    centred = jnp.where(honest[:, None], x - mu, 0)
    c = centred.T @ (centred @ z)
    c_norm = jnp.linalg.norm(c)
    step = a * z + (1 - a) * c / jnp.where(c_norm > 0, c_norm, 1)
    step_norm = jnp.linalg.norm(step)
    z = jnp.where((c_norm > 0) & (step_norm > 0), step / jnp.where(step_norm > 0, step_norm, 1), z)
    slot = jnp.argmax(jnp.where(honest, x @ z, -jnp.inf))
    return mu, z, slot


def flip_labels(y: jax.Array, num_classes: int) -> jax.Array:
    """Label flipping, y -> C - 1 - y: a Byzantine client trains on these labels (data poisoning).

    The label-flipping attack of Karimireddy, He, Jaggi (ICML 2021; ICLR 2022, whose code maps
    y -> 9 - y on MNIST and CIFAR-10). An involution: flipping twice gives y back.
    """
    return (num_classes - 1 - y).astype(y.dtype)


def byzantine_ids(key: jax.Array, num_clients: int, count: int) -> jax.Array:
    """bool [num_clients]: exactly ``count`` Byzantine clients of the population, the first
    ``count`` of a random permutation drawn from ``key`` (the same key, the same clients).
    ``num_clients`` and ``count`` are static."""
    if not 0 <= count <= num_clients:
        raise FljaxError(f"the number of Byzantine clients must be in [0, {num_clients}] "
                         f"(the number of clients), not {count}")
    chosen = jax.random.permutation(key, num_clients)[:count]
    return jnp.zeros(num_clients, bool).at[chosen].set(True)
