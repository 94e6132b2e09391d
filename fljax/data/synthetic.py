"""FedProx's Synthetic(alpha, beta) and Synthetic-IID (Li et al., MLSys 2020, section 5.1).

Every user (device) k has its own softmax-regression model and its own input distribution, so the
clients are given by the generator (partition ``natural``), not by a label partitioner:

    u_k ~ N(0, alpha^2),  B_k ~ N(0, beta^2)
    W_k[c, j] ~ N(u_k, 1),  b_k[c] ~ N(u_k, 1)      (10 classes x 60 features)
    v_k[j] ~ N(B_k, 1)
    x ~ N(v_k, Sigma),  Sigma diagonal with Sigma_jj = j^(-1.2), j = 1..60
    y = argmax softmax(W_k x + b_k) = argmax (W_k x + b_k)

alpha controls how much the users' models differ, beta how much their inputs differ.
Synthetic-IID has one W, b with entries ~ N(0, 1) for all users and v_k = 0 for all.

Choices where the paper is vague, after its generation code (FedProx repository,
``data/synthetic_*/generate_synthetic.py``, ``data/synthetic_iid/generate_iid.py``):

* alpha and beta are standard deviations (the code's ``np.random.normal(0, alpha)``); the paper
  writes N(0, alpha). The two readings agree for Synthetic(0, 0) and (1, 1).
* Synthetic-IID's common input mean is v = 0, as in the code (the paper: "the same distribution").
* User sizes follow a power law: n_k = floor(L_k) + 50 with L_k ~ lognormal(4, 2) (the code),
  capped at ``max_size`` (default 1000; ~8% of the users reach it) so that one heavy-tailed
  draw cannot make a dataset too large for a CPU: uncapped, the largest of 30 users has about
  3,000 examples in the median and over 10,000 in one dataset out of eight.
* Each user's examples are split into train and test, ``round(test_fraction * n_k)`` test
  examples (the paper's 80/20 split; its code keeps 10%). A user's examples are i.i.d., so the
  first ones are its training examples.

Generation is seeded: ``rng = np.random.default_rng(seed)`` draws, in this order,
L (num_users values); then for Synthetic(alpha, beta) u, then B (num_users values each), or for
Synthetic-IID W, then b; then for each user k in turn: v_k (60), W_k (10 x 60), b_k (10) (these
three only for Synthetic(alpha, beta)), and n_k x 60 standard normals z, x = v_k + sqrt(Sigma) z.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from fljax.data.dataset import Dataset
from fljax.errors import FljaxError

DIMENSION = 60
NUM_CLASSES = 10
SIGMA = np.arange(1, DIMENSION + 1, dtype=np.float64) ** -1.2   # diagonal of the input covariance


class SyntheticUsers(NamedTuple):
    """Each user's examples and the model and input mean that generated them."""

    x: list[np.ndarray]   # per user: [n_k, 60] float64
    y: list[np.ndarray]   # per user: [n_k] int32, argmax(x W_k^T + b_k)
    w: np.ndarray         # [U, 10, 60] W_k
    b: np.ndarray         # [U, 10] b_k
    v: np.ndarray         # [U, 60] v_k


def _check(name: str, value, low: float, integer: bool = False) -> None:
    kinds = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value < np.inf:
        raise FljaxError(f"{name} must be {'an integer' if integer else 'a finite number'} "
                         f">= {low:g}, got {value!r}")


def generate(alpha: float, beta: float, *, iid: bool = False, num_users: int = 30,
             max_size: int = 1000, seed: int = 0) -> SyntheticUsers:
    """Draw the users of Synthetic(alpha, beta), or of Synthetic-IID when ``iid`` (alpha and beta
    are then unused), by the process and in the draw order of the module docstring."""
    _check("alpha", alpha, 0)
    _check("beta", beta, 0)
    _check("num_users", num_users, 1, integer=True)
    _check("max_size", max_size, 50, integer=True)
    rng = np.random.default_rng(seed)
    sizes = np.minimum(np.floor(rng.lognormal(4.0, 2.0, num_users)).astype(np.int64) + 50,
                       max_size)
    if iid:
        w = rng.normal(0.0, 1.0, (NUM_CLASSES, DIMENSION))
        b = rng.normal(0.0, 1.0, NUM_CLASSES)
    else:
        model_mean = rng.normal(0.0, alpha, num_users)
        input_mean = rng.normal(0.0, beta, num_users)
    xs, ys, ws, bs, vs = [], [], [], [], []
    for k, n in enumerate(sizes):
        if iid:
            v = np.zeros(DIMENSION)
        else:
            v = rng.normal(input_mean[k], 1.0, DIMENSION)
            w = rng.normal(model_mean[k], 1.0, (NUM_CLASSES, DIMENSION))
            b = rng.normal(model_mean[k], 1.0, NUM_CLASSES)
        x = v + np.sqrt(SIGMA) * rng.standard_normal((n, DIMENSION))
        xs.append(x)
        ys.append(np.argmax(x @ w.T + b, axis=1).astype(np.int32))
        ws.append(w)
        bs.append(b)
        vs.append(v)
    return SyntheticUsers(xs, ys, np.stack(ws), np.stack(bs), np.stack(vs))


def load_synthetic(alpha: float = 1.0, beta: float = 1.0, *, iid: bool = False,
                   num_users: int = 30, max_size: int = 1000, test_fraction: float = 0.2,
                   seed: int = 0) -> Dataset:
    """Synthetic(alpha, beta) or Synthetic-IID as a Dataset whose users are its clients.

    x is float32 [N, 60], labels int32 in 0..9; ``user_train`` / ``user_test`` give each
    example's user (0..num_users-1); each user keeps ``round(test_fraction * n_k)`` examples for
    test. Named ``synthetic_ALPHA_BETA`` or ``synthetic_iid``.
    """
    if not 0.0 < test_fraction < 1.0:
        raise FljaxError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    users = generate(alpha, beta, iid=iid, num_users=num_users, max_size=max_size, seed=seed)
    train, test = [], []
    for k, (x, y) in enumerate(zip(users.x, users.y)):
        cut = len(y) - round(test_fraction * len(y))
        user = np.full(len(y), k, np.int32)
        train.append((x[:cut], y[:cut], user[:cut]))
        test.append((x[cut:], y[cut:], user[cut:]))
    x_train, y_train, user_train = (np.concatenate(a) for a in zip(*train))
    x_test, y_test, user_test = (np.concatenate(a) for a in zip(*test))
    name = "synthetic_iid" if iid else f"synthetic_{alpha:g}_{beta:g}"
    return Dataset(name, x_train.astype(np.float32), y_train, x_test.astype(np.float32), y_test,
                   NUM_CLASSES, user_train, user_test)
