"""Implicit gradient alignment (FedGA / GradAlign (Dandi, Barba and Jaggi, AAAI 2022)): FedGA's and
SCAFFOLD's (Theorems 4 and 5), SGD's (Theorem 1) and GradAlign's (Theorems 2 and 3).

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

Theorem 1 (SGD): K steps of size alpha on mini-batches a_1..a_K in an order drawn from any
distribution symmetric under reversal (here all K! orders), minus K GD steps on their mean f_A:

    E[x_SGD - x_GD] = -(alpha^2 / 2) sum_i Hess f_ai (grad f_ai - grad f_A) + O(alpha^3)
                    = -(K alpha^2 / 2) grad r_A + O(alpha^3),
    r_A = (1/2K) sum_i ||grad f_ai - grad f_A||^2

(redone: step i sees -alpha sum_{j<i} g_aj, so x_SGD = x - alpha K g_A + alpha^2 sum_{j<i} H_ai g_aj
+ O(alpha^3), and the reversal average of sum_{j<i} is (K^2 H_A g_A - sum_i H_ai g_ai) / 2). The
appendix's line -(alpha^2/4) sum_i (H_ai - H_A)(g_ai - g_A) is half of it (a typo: the lines around
it agree with the theorem). Run with jax on the same tanh MLP, the 4 clients' sets as the
mini-batches, alpha = 0.05 / 2^t: error slope 3.02, relative error 20% -> 1.2% (alpha = 0.003125).
One order alone misses by 2.2x the prediction at every alpha (the expectation is needed), and the
halved constant by 50%.

Theorem 2 (GradAlign, Algorithm 1 = FedGA with K = 1): x_GA - x_GD = -(alpha beta / 2n) grad
sum_i ||g_i - g||^2 + O(alpha beta^2). fljax's gradalign (local_steps=1) minus lbsgd at alpha =
0.05, beta = 0.05 / 2^t: the remainder has no alpha^2 beta term at K = 1, so at fixed alpha the
error falls as beta^2 (slope 2.01) while the prediction falls as beta; relative error 13% -> 0.8%.

Theorem 3 (descent): with f^ = f + beta r, r = (1/2n) sum_i ||g_i - g||^2 (= R / 2), a GradAlign
step with alpha < 1 / (2 L1) and a small enough beta decreases f^ unless grad f = grad r = 0. The
proof's step is x+ - x = -alpha grad f^(x) + O(alpha beta^2), so at a critical point of f (case 2)

    f^(x+) - f^(x) = -alpha beta^2 (||grad r||^2 - (alpha / 2) grad r^T Hess f grad r)
                     + O(alpha beta^3)

which is < 0 for alpha < 2 ||grad r||^2 / (grad r^T Hess f grad r) (>= 2 / L1 > 1 / (2 L1)) and
> 0 beyond. On the tanh MLP with f_i = CE_i + 0.1/2 ||x||^2 (CE alone has no finite minimum on
these clients; fljax's weight_decay), at a critical point x_c (||grad f|| = 2.4e-13, ||grad r|| =
0.36, Hess f eigenvalues 0.018-1.52, L1 = 1.52 taken locally), alpha = 0.9 / (2 L1) = 0.297:
f^ falls by 9.0e-5 ... 3.4e-7 (beta = 0.05 ... 0.003125), relative error 2.8% -> 0.18%, slope
2.98; alpha = 5.24 (1.5x the threshold): f^ rises by 7.1e-4 ... 3.3e-6, within 0.9% of the formula
at the smallest beta. At the initial model (case 1, grad f != 0), alpha = 0.287: f^ falls by
0.135 ... 0.131 for every beta, tending to the GD step's 0.130 linearly in beta (slope 0.995). Not
checked: the proof's explicit sufficient beta < min(beta', L1 / L2) (global L1, L2 and the Hessian
Lipschitz constant rho are not computable for this model; the local L1 stands in for L1).
"""

import functools
import itertools

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.optimize

from fljax.algorithms import fedavg, local_sgd, scaffold
from fljax.algorithms.base import tree_scale
from fljax.algorithms.fedga import fedga, gradalign, lbsgd
from fljax.data.federated import federate
from fljax.core.engine import init_state, make_round
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

        def client_losses(w):
            return jnp.asarray(means) @ example_losses(w, x, y)       # (f_1(w), ..., f_n(w))

        def client_grads(w):
            return jax.jacrev(client_losses)(w)

        def spread(w):
            g = jnp.concatenate([a.reshape(self.n, -1) for a in jax.tree.leaves(client_grads(w))],
                                axis=1)
            return jnp.sum(jnp.asarray(p) @ (g - jnp.asarray(p) @ g) ** 2)

        with jax.enable_x64(True):
            self.data = federate(x, y, parts, CLASSES)
            self.reference = jax.jit(lambda w: (client_grads(w), jax.grad(spread)(w)))
        # f = sum_i p_i f_i and R_p: for the FedGA theorems' objectives (Theorems 1-3)
        self.client_losses, self.spread = client_losses, spread
        self.objective = lambda w: jnp.asarray(p) @ client_losses(w)
        self._programs = {}

    def run(self, alg, t, *, params=None, state=None, local_steps=K, hparams=None):
        """The state after one round of ``alg`` run as round t (full participation, full-batch
        local steps), from ``state`` or from ``params`` (default the initial parameters).
        With ``hparams``, ``alg`` is a function of them (traced: one program for all values)."""
        with jax.enable_x64(True):
            if (id(alg), local_steps) not in self._programs:
                self._programs[id(alg), local_steps] = (alg, make_round(
                    alg, self.model, self.data, clients_per_round=self.n, batch_size=None,
                    local_steps=local_steps, aggregation=self.aggregation))
            program = self._programs[id(alg), local_steps][1]
            if state is None:
                start = self.params if params is None else params
                state = (init_state(alg, start, self.n, 0) if hparams is None
                         else program.init_state(start, 0, hparams))
            state, _ = program(state._replace(round=jnp.asarray(t, jnp.int32)))
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


# ------------------------------------------------------------------------------------------------
# Theorems 1-3 (see the module doc)

def unraveled(p):
    """(x0 flat, unravel) for the problem's parameters, in float64."""
    with jax.enable_x64(True):
        return jax.flatten_util.ravel_pytree(jax.tree.map(jnp.asarray, p.params))


def test_sgd_minus_gd_over_the_orderings_is_theorem_1():
    """K = n = 4 mini-batches (the clients' sets), every ordering equally likely (reversal
    symmetric); K SGD steps averaged over the 24 orderings minus K GD steps on f_A."""
    p = problem("equal")
    start, unravel = unraveled(p)
    with jax.enable_x64(True):
        def grads(v):
            g = jax.jacrev(p.client_losses)(unravel(v))
            return jnp.concatenate([a.reshape(p.n, -1) for a in jax.tree.leaves(g)], axis=1)

        def sgd(order, alpha):
            return jax.lax.scan(lambda v, i: (v - alpha * grads(v)[i], None), start, order)[0]

        def gd(alpha):
            return jax.lax.scan(lambda v, _: (v - alpha * grads(v).mean(0), None), start, None,
                                length=p.n)[0]

        orders = jnp.asarray(list(itertools.permutations(range(p.n))))
        differences = jax.jit(lambda alpha: (jax.vmap(sgd, (0, None))(orders, alpha).mean(0)
                                             - gd(alpha), sgd(orders[0], alpha) - gd(alpha)))
        alphas = [ALPHA0 / 2 ** t for t in ROUNDS]
        averaged, single = zip(*(map(np.asarray, differences(a)) for a in alphas))
    direction = p.direction(p.params)           # grad R_p, R_p = (1/K) sum_i ||g_i - g_A||^2
    predictions = [-a ** 2 * p.n / 4 * direction for a in alphas]     # -(K alpha^2 / 2) grad r_A
    check_order(alphas, averaged, predictions, last_relative=0.03)
    # One ordering alone is not the expectation, and the appendix's -(alpha^2/4) sum_i (H_i - H_A)
    # (g_i - g_A) (half the theorem's) is not the difference: both stay O(alpha^2) off.
    for got, predicted in ((single[-1], predictions[-1]), (averaged[-1], predictions[-1] / 2)):
        assert np.linalg.norm(got - predicted) > 0.4 * np.linalg.norm(predicted)


def traced_gradalign(h):
    """GradAlign with step size h["lr"] and weight decay h["wd"] (traced: one program for all),
    displacement ALPHA0 / 2^t in round t."""
    return halving_beta(gradalign(local_sgd(h["lr"], weight_decay=h["wd"]), beta=ALPHA0))


def test_gradalign_minus_gd_is_theorem_2():
    """fljax's gradalign (K = 1) minus lbsgd (GD on f) at alpha = 0.05 with beta = 0.05 / 2^t:
    the remainder is O(alpha beta^2), so the error falls as beta^2 while the prediction falls as
    beta."""
    p = problem("equal")
    alpha = 0.05
    direction = p.direction(p.params)
    with jax.enable_x64(True):
        gd = lbsgd(alpha)
    betas, differences, predictions = [], [], []
    for t in ROUNDS:
        beta = ALPHA0 / 2 ** t
        ga = p.run(traced_gradalign, t, local_steps=1, hparams={"lr": alpha, "wd": 0.0})
        differences.append(flat(ga.params) - flat(p.run(gd, t, local_steps=1).params))
        predictions.append(-alpha * beta / 2 * direction)   # -(alpha beta / 2n) grad R
        betas.append(beta)
    errors = [np.linalg.norm(d - q) for d, q in zip(differences, predictions)]
    relative = [e / np.linalg.norm(q) for e, q in zip(errors, predictions)]
    assert 1.7 < log_log_slope(betas, errors) < 2.3, (errors, relative)
    assert all(b < 0.6 * a for a, b in zip(relative, relative[1:])), relative
    assert relative[-1] < 0.02, relative


LAMBDA = 0.1     # f_i = CE_i + LAMBDA/2 ||x||^2: the tanh MLP's CE alone has no finite minimum here


def descent_problem():
    """f = sum_i p_i f_i + LAMBDA/2 ||x||^2 and r = R_p / 2 on flat vectors, and a critical
    point x_c of f (trust-region Newton)."""
    p = problem("equal")
    start, unravel = unraveled(p)
    with jax.enable_x64(True):
        def f(v):
            return p.objective(unravel(v)) + LAMBDA / 2 * v @ v

        def r(v):
            return p.spread(unravel(v)) / 2

        local = jax.jit(lambda v: (f(v), jax.grad(f)(v), jax.hessian(f)(v), r(v), jax.grad(r)(v)))
        critical = scipy.optimize.minimize(
            lambda v: float(local(v)[0]), np.asarray(start), method="trust-exact",
            jac=lambda v: np.asarray(local(v)[1]), hess=lambda v: np.asarray(local(v)[2]),
            options={"gtol": 1e-12}).x

    def at(v):
        """[f, grad f, Hess f, r, grad r] at v, as numpy."""
        with jax.enable_x64(True):
            return [np.asarray(a) for a in local(jnp.asarray(v))]

    return p, unravel, at, np.asarray(start), critical


def gradalign_changes(p, unravel, local, x, alpha):
    """f^(x+) - f^(x) for one GradAlign step (fljax's, K = 1) with step size alpha and
    displacement beta = ALPHA0 / 2^t, f^ = f + beta r, per t."""
    f0, _, _, r0, _ = local(x)
    with jax.enable_x64(True):
        start = unravel(jnp.asarray(x))
    changes = []
    for t in ROUNDS:
        beta = ALPHA0 / 2 ** t
        end = flat(p.run(traced_gradalign, t, local_steps=1, params=start,
                         hparams={"lr": alpha, "wd": LAMBDA}).params)
        f1, _, _, r1, _ = local(end)
        changes.append(float((f1 + beta * r1) - (f0 + beta * r0)))
    return np.array(changes)


def test_gradalign_descent_condition_is_theorem_3():
    """At a critical point x_c of f (grad f = 0, grad r != 0: case 2 of the proof), a step of
    size alpha < 1 / (2 L1) decreases f^ = f + beta r by

        alpha beta^2 (||grad r||^2 - (alpha / 2) grad r^T Hess f grad r) + O(alpha beta^3),

    the descent coming from the regularizer alone; at alpha beyond 2 ||grad r||^2 / (grad r^T
    Hess f grad r) (> 2 / L1) the same formula and the step increase f^. Away from critical
    points (case 1, the initial model) the step decreases f^ for every beta tried and tends to
    the GD step's decrease of f as beta -> 0. L1 is the local ||Hess f||_2 (the theorem's is a
    global bound: the step moves x by < 0.01)."""
    p, unravel, local, start, critical = descent_problem()
    _, grad_f, hess_f, _, grad_r = local(critical)
    assert np.linalg.norm(grad_f) < 1e-10 and np.linalg.norm(grad_r) > 0.1
    alpha = 0.9 / (2 * np.abs(np.linalg.eigvalsh(hess_f)).max())
    betas = np.array([ALPHA0 / 2 ** t for t in ROUNDS])

    def predicted(a):
        return -a * betas ** 2 * (grad_r @ grad_r - a / 2 * grad_r @ hess_f @ grad_r)

    changes = gradalign_changes(p, unravel, local, critical, alpha)
    assert (changes < 0).all(), changes
    errors = np.abs(changes - predicted(alpha))
    relative = errors / np.abs(predicted(alpha))
    assert 2.7 < log_log_slope(betas, errors) < 3.3, (changes, relative)
    assert relative[-1] < 0.01 and all(b < 0.6 * a for a, b in zip(relative, relative[1:]))
    too_large = 1.5 * 2 * (grad_r @ grad_r) / (grad_r @ hess_f @ grad_r)
    changes = gradalign_changes(p, unravel, local, critical, too_large)
    assert (changes > 0).all() and (predicted(too_large) > 0).all(), changes
    np.testing.assert_allclose(changes[-1], predicted(too_large)[-1], rtol=0.05)
    # case 1: grad f != 0
    f0, grad_f, hess_f, _, _ = local(start)
    alpha = 0.9 / (2 * np.abs(np.linalg.eigvalsh(hess_f)).max())
    changes = gradalign_changes(p, unravel, local, start, alpha)
    gd_change = local(start - alpha * grad_f)[0] - f0
    assert (changes < 0).all() and gd_change < 0, changes
    assert 0.8 < log_log_slope(betas, np.abs(changes - gd_change)) < 1.2
