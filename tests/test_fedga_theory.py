"""FedGA's and SCAFFOLD's implicit gradient alignment (fedga-gradalign.txt, Theorems 4 and 5).

One round from x, n clients, all sampled, each client i taking K local steps of size alpha on its
objective f_i; f = (1/n) sum_i f_i, g_i = grad f_i(x), H_i = Hess f_i(x), g = grad f(x),
H = Hess f(x), and

    R(x) = sum_i ||grad f_i(x) - grad f(x)||^2.

Theorem 4 (FedGA, Algorithm 2: x_i,0 = x - beta (g - g_i), then K steps; x+ = mean_i x_i,K):

    x_FedGA - x_FedAvg = -(alpha beta K / 2n) grad R(x) + O(alpha beta (alpha + beta))

Theorem 5 (SCAFFOLD as Appendix A.6's Algorithm 4 defines it: each step adds g - g_i, the full
gradients at THIS round's x; no control variate is carried over from an earlier round):

    x_SCAFFOLD - x_FedAvg = -(alpha^2 K (K-1) / 4n) grad R(x) + O(alpha^3)

The constants are the paper's, and its appendix derivation (redone here) gives them: a client's
displacement from x before step k is d_i - (k-1) alpha g_i + O(alpha^2 + alpha beta) with
d_i = beta (g_i - g) for FedGA, and -(k-1) alpha g before step k of SCAFFOLD; one Taylor term per
step gives, averaged over clients (sum_i d_i = 0 and sum_i (g_i - g) = 0),

    FedGA - FedAvg    = -(alpha K / n) sum_i H_i d_i = -(alpha beta K / n) sum_i (H_i - H)(g_i - g)
    SCAFFOLD - FedAvg = (alpha^2 K (K-1) / 2) (H g - (1/n) sum_i H_i g_i)
                      = -(alpha^2 K (K-1) / 2n) sum_i (H_i - H)(g_i - g)

and sum_i (H_i - H)(g_i - g) = grad R / 2. The paper writes FedGA's remainder as O(alpha beta^2);
for K >= 2 it also has alpha^2 beta terms ((alpha^2 K (K-1) / 2n) sum_i H_i^2 d_i: step 2 sees step
1's H_i d_i; on quadratics, where x_i,K - a_i = (1 - alpha H_i)^K (x_i,0 - a_i), it is the whole
remainder). So the test holds beta = alpha as alpha falls: the prediction is then O(alpha^2) and
the remainder O(alpha^3), i.e. the error's log-log slope in alpha is 3 and the relative error
halves with alpha (measured: slopes 2.9-3.0, relative errors 1-3% at alpha = 0.003125). With beta
fixed the relative error would not vanish; a wrong constant or sign would leave an O(alpha^2)
error (slope 2).

With client weights p_i (sum p_i = 1; f = sum_i p_i f_i, g = sum_i p_i g_i, x+ = sum_i p_i x_i,K)
the same steps give -(alpha beta K / 2) grad sum_i p_i ||grad f_i - grad f||^2 for FedGA: this is
fljax's FedGA with aggregation='examples' on clients of unequal size (its gbar is n_i-weighted);
with equal sizes it is the paper's form.

What is run: fljax's own fedavg, fedga and scaffold, one round each in float64 (x64), all clients,
``batch_size=None`` (full-batch, deterministic local steps: the expectation over mini-batches is
trivial), on a small smooth model (a tanh MLP with softmax cross-entropy; ReLU is not smooth),
n = 4 clients, K = 3. The prediction uses exact gradients of R (jax.grad of a hand-written loss,
not fljax's). Step sizes alpha = 0.05 / 2^t, t = 0..4: the local lr decays by 1/2 per round
(``round_decay=0.5``) and the state's round counter is set to t, so one compiled program per
algorithm serves every alpha; FedGA's exchanged gradients are scaled by 1/2^t in the same program
(``halving_beta``), which makes its displacement beta / 2^t (checked against a plain fedga).

SCAFFOLD: fljax keeps control variates across rounds (option I: c_i+ = g_i(x) at the round's
broadcast model, used from the NEXT round on; option II: from the local trajectory), so its first
round has c = c_i = 0 and is FedAvg. Theorem 5's variant (the paper's code's ``Scaffold``, which
recomputes full gradients each round) is one round of fljax's scaffold from the state
c_i = g_i(x), c = g(x) at its own start point. Also checked: fljax's stateful SCAFFOLD as it runs,
in its SECOND round with full participation and uniform weights, meets Theorem 5 to the same
order: its variates are one round stale (c - c_i = g - g_i + e_i with e_i = O(alpha) and
sum_i e_i = 0 because c = mean_i c_i), which moves the end point by O(alpha^3) only. (Under partial
participation sum_S (c - c_i) != 0 and the first-order update itself changes; not covered.)
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.algorithms import fedavg, local_sgd, scaffold
from fljax.algorithms.base import tree_scale
from fljax.algorithms.fedga import fedga
from fljax.data.federated import federate
from fljax.engine import init_state, make_round
from fljax.models import from_module

DIM, CLASSES, HIDDEN, K = 3, 3, 4, 3
ALPHA0 = 0.05                               # round t runs at alpha = ALPHA0 / 2^t
ROUNDS = (0, 1, 2, 3, 4)                    # alpha = 0.05, 0.025, ..., 0.003125
CLIENTS = {"equal": ((6, 6, 6, 6), "uniform"), "unequal": ((4, 9, 6, 7), "examples")}


class TanhMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = jnp.tanh(nn.Dense(HIDDEN, name="hidden")(x.reshape(x.shape[0], -1)))
        return nn.Dense(CLASSES, name="out")(h)


def example_losses(w, x, y):
    """Softmax cross-entropy of each example under the tanh MLP, written out (not fljax's)."""
    logits = jnp.tanh(x @ w["hidden"]["kernel"] + w["hidden"]["bias"]) @ w["out"]["kernel"] \
        + w["out"]["bias"]
    return -jax.nn.log_softmax(logits)[jnp.arange(len(y)), y]


def flat(tree):
    return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])


class Problem:
    """Heterogeneous clients (label skew, a client-dependent input shift), float64 parameters, the
    fljax model and data, and ``reference(w) -> (stacked g_i(w), grad R_p(w))`` where
    R_p = sum_i p_i ||g_i - g||^2, g = sum_i p_i g_i, p_i = n_i / sum_j n_j (= R / n for equal
    clients), f_i the mean loss over client i's examples."""

    def __init__(self, clients):
        sizes, self.aggregation = CLIENTS[clients]
        self.n = len(sizes)
        rng = np.random.default_rng(0)
        owner = np.repeat(np.arange(self.n), sizes)
        y = (owner + rng.integers(0, 2, len(owner))) % CLASSES
        x = rng.normal(size=(len(owner), DIM)) + 0.5 * np.eye(DIM)[y] + 0.3 * owner[:, None]
        parts = [np.flatnonzero(owner == i) for i in range(self.n)]
        self.model = from_module("tanh_mlp", TanhMLP(), (DIM,), CLASSES)
        self.params = {"hidden": {"kernel": rng.normal(size=(DIM, HIDDEN)) / np.sqrt(DIM),
                                  "bias": 0.1 * rng.normal(size=HIDDEN)},
                       "out": {"kernel": rng.normal(size=(HIDDEN, CLASSES)) / np.sqrt(HIDDEN),
                               "bias": 0.1 * rng.normal(size=CLASSES)}}
        assert jax.tree.structure(self.params) == jax.tree.structure(
            jax.eval_shape(self.model.init, jax.random.PRNGKey(0)))
        means = np.equal.outer(np.arange(self.n), owner) / np.array(sizes)[:, None]  # f_i = M l
        p = np.array(sizes, np.float64) / sum(sizes)

        def client_grads(w):
            return jax.jacrev(lambda v: jnp.asarray(means) @ example_losses(v, x, y))(w)

        def spread(w):
            g = jnp.concatenate([a.reshape(self.n, -1) for a in jax.tree.leaves(client_grads(w))],
                                axis=1)
            return jnp.sum(jnp.asarray(p) @ (g - jnp.asarray(p) @ g) ** 2)

        with jax.enable_x64(True):
            self.data = federate(x, y, parts, CLASSES)
            self.reference = jax.jit(lambda w: (client_grads(w), jax.grad(spread)(w)))
        self._programs = {}

    def run(self, alg, t, *, params=None, state=None):
        """The state after one round of ``alg`` run as round t (full participation, full-batch
        local steps), from ``state`` or from ``params`` (default the initial parameters)."""
        with jax.enable_x64(True):
            if id(alg) not in self._programs:
                self._programs[id(alg)] = (alg, make_round(
                    alg, self.model, self.data, clients_per_round=self.n, batch_size=None,
                    local_steps=K, aggregation=self.aggregation))
            if state is None:
                state = init_state(alg, self.params if params is None else params, self.n, 0)
            state, _ = self._programs[id(alg)][1](state._replace(round=jnp.asarray(t, jnp.int32)))
            return jax.tree.map(np.asarray, state)

    def direction(self, w):
        """grad R_p(w), flattened."""
        with jax.enable_x64(True):
            return flat(self.reference(w)[1])


@functools.lru_cache(maxsize=None)
def problem(clients):
    return Problem(clients)


LOCAL = local_sgd(ALPHA0, round_decay=0.5)      # alpha_t = ALPHA0 / 2^t
FEDAVG = fedavg(LOCAL)


def halving_beta(alg):
    """FedGA whose exchanged gradients are scaled by 1/2^t: its displacement is then
    x - (beta / 2^t) (gbar - g_i), i.e. beta_t / alpha_t stays fixed with ONE compiled program
    (``cohort_start`` sends (n_i g_i, n_i); client_start divides and uses its own message)."""
    def cohort_start(ctx):
        total, n = alg.cohort_start(ctx)
        return tree_scale(0.5 ** ctx.round, total), n

    return alg._replace(cohort_start=cohort_start)


def log_log_slope(alphas, values):
    return float(np.polyfit(np.log(alphas), np.log(values), 1)[0])


def check_order(alphas, differences, predictions, *, last_relative):
    """|difference - prediction| falls as alpha^3 while the prediction falls as alpha^2."""
    errors = [np.linalg.norm(d - p) for d, p in zip(differences, predictions)]
    relative = [e / np.linalg.norm(p) for e, p in zip(errors, predictions)]
    assert 1.95 < log_log_slope(alphas, [np.linalg.norm(p) for p in predictions]) < 2.05
    assert 2.7 < log_log_slope(alphas, errors) < 3.3, (errors, relative)
    assert all(b < 0.7 * a for a, b in zip(relative, relative[1:])), relative
    assert relative[-1] < last_relative, relative
    return relative


def test_halving_beta_is_fedga_with_the_halved_beta():
    """The rescaled messages give FedGA with beta / 2^t exactly (round 1: lr 0.1, beta 0.1)."""
    p = problem("unequal")
    with jax.enable_x64(True):
        halved = halving_beta(fedga(LOCAL, beta=ALPHA0))
        plain = fedga(local_sgd(ALPHA0 / 2), beta=ALPHA0 / 2)
    a, b = (flat(p.run(alg, t).params) for alg, t in ((halved, 1), (plain, 0)))
    np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("clients", ["equal", "unequal"])
def test_fedga_minus_fedavg_is_theorem_4(clients):
    """beta = alpha; p_i = 1/n (equal clients, uniform averaging: the paper's form) or
    n_i / sum_j n_j (unequal clients, aggregation='examples': the weighted form)."""
    p = problem(clients)
    direction = p.direction(p.params)
    with jax.enable_x64(True):
        ga = halving_beta(fedga(LOCAL, beta=ALPHA0))
    alphas, differences, predictions = [], [], []
    for t in ROUNDS:
        alpha = beta = ALPHA0 / 2 ** t
        differences.append(flat(p.run(ga, t).params) - flat(p.run(FEDAVG, t).params))
        predictions.append(-alpha * beta * K / 2 * direction)      # R_p holds the 1/n
        alphas.append(alpha)
    check_order(alphas, differences, predictions, last_relative=0.03)


def test_scaffold_with_fresh_control_variates_minus_fedavg_is_theorem_5():
    """Algorithm 4: fljax's scaffold run for one round from the state c_i = g_i(x), c = g(x)."""
    p = problem("equal")
    direction = p.direction(p.params)
    with jax.enable_x64(True):
        alg = scaffold(LOCAL, option="I")
    alphas, differences, predictions = [], [], []
    for t in ROUNDS:
        alpha = ALPHA0 / 2 ** t
        with jax.enable_x64(True):
            c_i = p.reference(p.params)[0]
            state = init_state(alg, p.params, p.n, 0)._replace(
                server_state=jax.tree.map(lambda a: a.mean(0), c_i), client_states=c_i)
        differences.append(flat(p.run(alg, t, state=state).params)
                           - flat(p.run(FEDAVG, t).params))
        predictions.append(-alpha ** 2 * K * (K - 1) / 4 * direction)
        alphas.append(alpha)
    check_order(alphas, differences, predictions, last_relative=0.03)


@pytest.mark.parametrize("option", ["I", "II"])
def test_stateful_scaffold_meets_theorem_5_from_its_second_round(option):
    """fljax's SCAFFOLD as it runs: round t (c = c_i = 0: FedAvg) at 2 alpha, then round t + 1 at
    alpha from its end point x1 with the control variates round t left, against FedAvg from x1;
    the prediction is taken at x1."""
    p = problem("equal")
    with jax.enable_x64(True):
        alg = scaffold(LOCAL, option=option)
    alphas, differences, predictions = [], [], []
    for t in ROUNDS:
        alpha = ALPHA0 / 2 ** (t + 1)
        first = p.run(alg, t)
        x1 = first.params
        differences.append(flat(p.run(alg, t + 1, state=first).params)
                           - flat(p.run(FEDAVG, t + 1, params=x1).params))
        predictions.append(-alpha ** 2 * K * (K - 1) / 4 * p.direction(x1))
        alphas.append(alpha)
    check_order(alphas, differences, predictions, last_relative=0.03)
