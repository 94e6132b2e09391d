"""Theory statements of FedBug and FedDecay checked against their formulas, in float64.

FedBug, Figure 2a (FedBug (Kao and Wang, 2023) section 4, appendix B.5-B.6;
``experiments/fedbug_toy.py``). Two clients, f(x) = x [a, b]^T v, L1 = (a v - 1)^2, L2 = (b v -
1)^2; each round both clients run K local SGD steps from the server's (a, b, v) and the server
averages. With d^i = |a^i - b^i| and r^i = d^{i+1} / d^i (Definitions 1-2), Theorem 1 (FedAvg) and
Theorem 2 (FedBug: v frozen for the first f local steps; eq. 7) give

    r = (1 + m cos^2(theta) (1 + alpha)) / 2,      m = (1 - 2 lr v^2)^f   (FedAvg: f = 0, m = 1)

theta the angle between a client's local update direction (its loss gradient in its (w, v)
plane, parallel to the model gradient (v, w)) and the v axis: cos^2(theta_1) = a^2 / (a^2 + v^2),
cos^2(theta_2) = b^2 / (b^2 + v^2), averaged; alpha -> 0 in the linear limit. (The paper writes
m = 1 - eta v^2 for a loss whose gradient drops the 2: eta = 2 lr here.) It is a statement about
the linearized dynamics near the minima a = b = 1 / v (Assumptions 1-3) after local convergence,
not about a small learning rate: measured on the paper's setup (50 seeds from U[0, 2]^3, lr 0.1,
K = 50, 80 rounds), |r - r_th| <= 1.7e-6 (FedAvg), 1.2e-5 (FedBug, f = 1) and 8.6e-6 (f = 5) over
the ~1,200-1,650 rounds whose server model is within delta < 1e-3 of the minima (delta^i =
max(d^i, |a^i v^i - 1|, |b^i v^i - 1|)), and the median error falls ~80x per decade of delta
(about delta^2); lr 0.02 with K = 250 (closer to gradient flow, the same lr K) gives 4.5e-6 /
2.3e-5, not less; K = 10 (clients not converged) leaves a median error of 9e-4 that does not
shrink. Wrong formulas miss by >= 2e-2 on the same rounds: sin^2 (the angle to the a axis), cos
unsquared, cos^2 alone (no averaging with the unmoved half), m = 1 or m = 1 - lr v^2 for FedBug.

FedDecay, Table 1 (FedDecay (Anonymous, 2023) section 3.3, Appendix A). Local step k of client i is
theta_i^k = theta_i^{k-1} - eta beta_{k-1} g_i^{k-1}; with g~_i = grad F_i(theta_g), H~_i = Hess
F_i(theta_g), the method gradient g_method = (theta_g - theta_i^K) / eta expands (Appendix A) as

    E[g_method] = A * AvgGrad - eta * B * AvgGradInner + O(eta^2),
    AvgGrad = E_i[g~_i],  AvgGradInner = E_i[H~_i g~_i]       (full-batch: F_i^j = F_i for all j)

with A = sum_j beta_j = B(K), B = sum_j beta_j B(j), B(k) = sum_{j<k} beta_j, and the ratio of
Table 1, eta B / A:

    FedSGD (= FedDecay beta = 0): 0           FedAvg (= FedDecay beta = 1): (K - 1) eta / 2
    FedDecay (beta_j = beta^j): (beta - beta^K) eta / (1 - beta^2)    FOMAML: (K - 1) eta

(and eta sum_j beta_j B(j) / B(K) for any beta_j, Appendix A). The coefficients are measured on
fljax's own rounds: one round of feddecay (exponential and linear, per local step; beta = 1 is
FedAvg's update, beta = 0 FedSGD's) and fomaml, full participation, uniform weights, full-batch
steps, float64, on a small tanh MLP (4 users), at eta = 0.01 / 2^t, t = 0..4: theta_g -
theta_g'(eta) = eta A G - eta^2 B Q + O(eta^3) is fitted by a polynomial in eta, and A, B are
the components of its first two coefficients on G = AvgGrad and Q = AvgGradInner (exact
gradients and Hessians by jax). Measured (K = 2, 5): both coefficients are parallel to G and Q
(residuals <= 2.2e-7 and <= 2.3e-4 relative), A within 8e-8 and B within 5e-5 (relative) of
Appendix A's values, so the ratios meet Table 1 to 5e-5 (FedSGD's B: |B| < 1e-10). Eq. 6 of the
paper prints the AvgGradInner coefficient of exponential FedDecay as (1 - beta^(K-1)) (1 - beta^K)
/ ((1 + beta)(1 - beta)^2): it lacks a factor beta (Appendix A's derivation and Table 1 have it);
the measured coefficient has it.

FedDecay, Theorems 1-2: eta_t = alpha_{floor(t/K)} beta_{t mod K}, alpha_n = c / (n + d).
``local_sgd(lr, inverse_decay_offset=d)`` makes round n's learning rate lr d / (n + d) = c /
(n + d) with c = lr d (bit for bit, traced and concrete); under ``feddecay`` local step k of
round n then takes c / (n + d) beta_k (bit for bit with the linear decay; within 2 ulps with the
exponential one, whose beta^k is XLA's pow, an ulp off Python's for some beta and k).

Theorem 1 (full participation; L-smooth, mu-strongly convex F_i; bounded variance and gradients;
c = 3 / (mu beta_{K-1}), d = max(12 kappa / beta_{K-1}, 4 - 2/K), kappa = L / mu) bounds
E[F(theta_N)] - F* and E||theta_N - theta*||^2 by O(1 / (N + d - 2)). Checked on L2-regularized
softmax regression (fljax's models train on cross-entropy, so not a quadratic: strongly convex
with mu = lambda, smooth with L = lambda + max_i lambda_max(E_i[x~ x~^T]) / 2, x~ = (x, 1);
lambda = 1, L = 3.6, c = 4.69, d = 67.6), mini-batches of 2 (the noise that makes the rate 1/N
rather than faster), 4 users, K = 3, beta = 0.8, E over 32 seeds: (N + d - 2) E||theta_N -
theta*||^2 = 0.25-0.35 for N = 25..400 (within a factor 2 is asserted) and the log-log slope in
N + d - 2 is -0.99; the same runs at a constant learning rate (d -> infinity) level off (slope
-0.03, 6.5x the error at N = 400). Not run here (a second program): Theorem 2's partial
participation (2 of 4 users a round), measured once at (N + d - 2) E||.||^2 = 1.0-1.3, slope
-0.96. The explicit constant of the bound is not checked (G and sigma^2 are suprema over all
local iterates, which the round does not expose).
"""

import functools

import flax.linen as nn
import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.algorithms import local_sgd
from fljax.algorithms.base import ClientContext
from fljax.algorithms.feddecay import decay_coefficient, feddecay
from fljax.algorithms.meta import fomaml
from fljax.data.federated import federate
from fljax.core.engine import make_round
from fljax.errors import FljaxError
from fljax.models import from_module
from tests import experiment_script
from tests.test_fedga_theory import problem


def log_log_slope(x, y):
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


# ------------------------------------------------------------------------------------------------
# FedBug, Figure 2a

def load_toy():
    return experiment_script.load("fedbug_toy")


TOY = load_toy()
NEAR, TOLERANCE = 1e-3, 5e-5       # delta^i < NEAR: |r - r_th| < TOLERANCE
BANDS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5)


def near_minima(res):
    return (res["delta"][:, :-1] < NEAR) & (res["d"][:, :-1] > TOY.THEORY_D_MIN)


@pytest.mark.parametrize("fraction", [0.0, 0.04, 0.2])   # FedAvg; v frozen 1 and 5 steps
def test_fedbug_figure_2a_theory_is_the_ratio_near_the_minima(fraction):
    res = TOY.run(fraction)                                     # the paper's setup
    frozen = int(fraction * TOY.LOCAL_STEPS // 2)
    a, b, v = (res[k][:, :-1] for k in "abv")
    np.testing.assert_array_equal(
        res["theory"], TOY.theoretical_ratio(a, b, v, frozen_v_steps=frozen))
    near = near_minima(res)
    assert near.sum() > 1000
    error = np.abs(res["r"] - res["theory"])
    assert error[near].max() < TOLERANCE, error[near].max()
    # The error shrinks with the distance from the minima (about as delta^2).
    delta, defined = res["delta"][:, :-1], res["d"][:, :-1] > TOY.THEORY_D_MIN
    medians, maxima = [], []
    for hi, lo in zip(BANDS, BANDS[1:]):
        band = defined & (delta >= lo) & (delta < hi)
        assert band.sum() > 200
        medians.append(np.median(error[band]))
        maxima.append(error[band].max())
    assert all(b < a / 20 for a, b in zip(medians, medians[1:])), medians
    assert all(b < a / 5 for a, b in zip(maxima, maxima[1:])), maxima
    # Wrong formulas miss by far more than the tolerance.
    cos1, cos2 = (np.cos(t) ** 2 for t in TOY.update_angles(a, b, v))
    cos_sq, m = (cos1 + cos2) / 2, (1 - 2 * TOY.LR * v ** 2) ** frozen
    wrong = {"sin^2": (1 + m * (1 - cos_sq)) / 2, "cos": (1 + m * np.sqrt(cos_sq)) / 2,
             "cos^2 alone": m * cos_sq}
    if frozen:
        wrong |= {"m = 1": (1 + cos_sq) / 2,
                  "m = 1 - lr v^2": (1 + (1 - TOY.LR * v ** 2) ** frozen * cos_sq) / 2}
    for name, formula in wrong.items():
        assert np.abs(res["r"] - formula)[near].max() > 1e-2, name


def test_fedbug_figure_2a_needs_local_convergence_not_a_small_learning_rate():
    """The derivation's limit is the minima plus converged clients: lr 0.02 with K = 250 (the
    same lr K, nearer gradient flow) agrees no better than lr 0.1, K = 50; K = 10 (clients not
    converged) leaves an error that does not vanish near the minima."""
    paper = TOY.theory_error(TOY.run(0.0))
    flow = TOY.theory_error(TOY.run(0.0, lr=0.02, steps=250))
    assert flow.max() < TOLERANCE and flow.max() > paper.max() / 3, (paper.max(), flow.max())
    short = TOY.theory_error(TOY.run(0.0, steps=10))
    assert np.median(short) > 2e-4, np.median(short)


# ------------------------------------------------------------------------------------------------
# FedDecay, Table 1

ETAS = 0.01 / 2.0 ** np.arange(5)


def beta_sequence(beta, schedule, steps):
    return [float(decay_coefficient(beta, schedule, j)) for j in range(steps)]


def appendix_a(betas):
    """(A, B) = (sum_j beta_j, sum_j beta_j sum_{h<j} beta_h)."""
    return sum(betas), sum(b * sum(betas[:j]) for j, b in enumerate(betas))


def table_1(method, steps, beta=None):
    """Table 1's ratio / eta."""
    if method == "fomaml":
        return steps - 1.0
    return (beta - beta ** steps) / (1 - beta ** 2) if 0 < beta < 1 else \
        (steps - 1) / 2 * beta


def flat_vector(tree):
    return np.concatenate([np.ravel(np.asarray(a)) for a in jax.tree.leaves(tree)])


@functools.lru_cache(maxsize=None)
def avg_grad_and_inner():
    """G = E_i[g_i] and Q = E_i[H_i g_i] at the initial model (uniform over the users)."""
    p = problem("equal")
    with jax.enable_x64(True):
        start, unravel = jax.flatten_util.ravel_pytree(jax.tree.map(jnp.asarray, p.params))

        def grads(v):
            g = jax.jacrev(p.client_losses)(unravel(v))
            return jnp.concatenate([a.reshape(p.n, -1) for a in jax.tree.leaves(g)], axis=1)

        g, h = (np.asarray(a) for a in jax.jit(lambda v: (grads(v), jax.jacfwd(grads)(v)))(start))
    return g.mean(0), np.einsum("ipq,iq->ip", h, g).mean(0)


def first_round_moves(builder, steps, hparams):
    """theta_g - theta_g' after one round of fljax's ``builder(hparams)`` per run."""
    p = problem("equal")
    runs = len(next(iter(hparams.values())))
    with jax.enable_x64(True):
        round_fn = make_round(builder, p.model, p.data, clients_per_round=p.n, batch_size=None,
                              local_steps=steps, aggregation="uniform", runs=runs)
        state, _ = round_fn(round_fn.init_state(p.params, list(range(runs)), hparams))
        ends = np.asarray(jax.vmap(lambda tree: jax.flatten_util.ravel_pytree(tree)[0])(
            state.params))
    return flat_vector(p.params) - ends


def coefficients(moves, g, q):
    """(A, B) from moves at ETAS: fit eta c1 + eta^2 c2 + eta^3 c3 + eta^4 c4, then A = <c1, G> /
    |G|^2 and B = -<c2, Q> / |Q|^2, after checking c1 is along G and c2 along Q."""
    c = np.linalg.lstsq(np.vander(ETAS, 5, increasing=True)[:, 1:], moves, rcond=None)[0]
    a, b = c[0] @ g / (g @ g), -c[1] @ q / (q @ q)
    assert np.linalg.norm(c[0] - a * g) < 1e-6 * np.linalg.norm(c[0])
    if np.linalg.norm(c[1]) > 1e-8 * np.linalg.norm(c[0]):       # (FedSGD's is rounding noise)
        assert np.linalg.norm(c[1] + b * q) < 1e-3 * np.linalg.norm(c[1])
    return a, b


@pytest.mark.parametrize("steps", [2, 5])
def test_feddecay_table_1_ratios(steps):
    """FedDecay beta in {0 (FedSGD), 0.3, 0.6, 0.9, 1 (FedAvg)}, exponential per local step."""
    g, q = avg_grad_and_inner()
    betas = (0.0, 0.3, 0.6, 0.9, 1.0)
    grid = [(beta, eta) for beta in betas for eta in ETAS]
    moves = first_round_moves(
        lambda h: feddecay(local_sgd(h["lr"]), h["beta"], per="step"), steps,
        {"lr": [eta for _, eta in grid], "beta": [beta for beta, _ in grid]})
    for i, beta in enumerate(betas):
        a, b = coefficients(moves[i * len(ETAS):(i + 1) * len(ETAS)], g, q)
        expected_a, expected_b = appendix_a(beta_sequence(beta, "exponential", steps))
        np.testing.assert_allclose(a, expected_a, rtol=1e-6)
        if beta == 0:                                     # FedSGD: no AvgGradInner term
            assert abs(b) < 1e-8, b
            continue
        np.testing.assert_allclose(b, expected_b, rtol=2e-4)
        np.testing.assert_allclose(b / a, table_1("feddecay", steps, beta), rtol=2e-4)
        if 0 < beta < 1:
            # eq. 6 as printed (no factor beta) is not the coefficient
            printed = ((1 - beta ** (steps - 1)) * (1 - beta ** steps)
                       / ((1 + beta) * (1 - beta) ** 2))
            assert abs(b - printed) > 0.05 * printed, (b, printed)


@pytest.mark.parametrize("steps", [2, 5])
def test_fomaml_table_1_ratio(steps):
    """FOMAML's method gradient g_i^{K-1}: A = 1, B = K - 1."""
    g, q = avg_grad_and_inner()
    moves = first_round_moves(lambda h: fomaml(local_sgd(h["lr"])), steps, {"lr": list(ETAS)})
    a, b = coefficients(moves, g, q)
    np.testing.assert_allclose(a, 1.0, rtol=1e-6)
    np.testing.assert_allclose(b / a, table_1("fomaml", steps), rtol=2e-4)


def test_feddecay_appendix_a_ratio_for_a_linear_decay():
    """beta_j = max(1 - j (1 - beta), 0), K = 5, beta = 0.7: 1, 0.7, 0.4, 0.1, 0."""
    g, q = avg_grad_and_inner()
    moves = first_round_moves(lambda h: feddecay(local_sgd(h["lr"]), 0.7, "linear", per="step"),
                              5, {"lr": list(ETAS)})
    a, b = coefficients(moves, g, q)
    expected_a, expected_b = appendix_a(beta_sequence(0.7, "linear", 5))
    np.testing.assert_allclose((a, b), (expected_a, expected_b), rtol=2e-4)


# ------------------------------------------------------------------------------------------------
# FedDecay, Theorems 1-2: the round schedule alpha_n = c / (n + d)

def step_rates(local, beta, schedule, round_index, steps):
    """The learning rate of each of ``steps`` local steps of round ``round_index`` under
    ``feddecay(local, beta)`` per step: minus the update of a unit gradient."""
    alg = feddecay(local, beta, schedule, per="step")
    params = {"w": jnp.zeros(())}
    ctx = ClientContext(params=params, server_state=(), client_state=(), round=round_index,
                        client_id=jnp.int32(0), weight=jnp.ones(()), cohort_size=1,
                        num_clients=1, num_examples=jnp.int32(1), mean_examples=jnp.ones(()),
                        num_steps=jnp.int32(steps), max_steps=steps,
                        steps_per_epoch=jnp.int32(1), full_gradient=None)
    tx = alg.client_tx(ctx)
    state, rates = tx.init(params), []
    for _ in range(steps):
        updates, state = tx.update({"w": jnp.ones(())}, state, params)
        rates.append(-updates["w"])
    return jnp.stack(rates)


@pytest.mark.parametrize("schedule, beta", [("exponential", 0.7), ("exponential", 0.3),
                                            ("linear", 0.75), ("linear", 0.7)])
def test_inverse_decay_offset_gives_c_over_n_plus_d_times_beta_k(schedule, beta):
    lr, d, steps = 0.3, 7.5, 6
    c = lr * d
    rounds = np.arange(40)
    with jax.enable_x64(True):
        lr_of = jax.jit(jax.vmap(lambda n, dd: local_sgd(lr, inverse_decay_offset=dd).lr(n),
                                 (0, None)))
        # the round's rate, traced n and d, and concrete
        np.testing.assert_array_equal(lr_of(jnp.asarray(rounds, jnp.int32), jnp.float64(d)),
                                      c / (rounds + d))
        for n in (0, 1, 9, 39):
            assert local_sgd(lr, inverse_decay_offset=d).lr(n) == c / (n + d)
            traced = jax.jit(step_rates, static_argnums=(2, 4))(
                local_sgd(lr, inverse_decay_offset=jnp.float64(d)), jnp.float64(beta), schedule,
                jnp.int32(n), steps)
            concrete = step_rates(local_sgd(lr, inverse_decay_offset=d), beta, schedule, n,
                                  steps)
            expected = np.array([c / (n + d) * b
                                 for b in beta_sequence(beta, schedule, steps)])
            if schedule == "linear":         # beta_k exact in both: the rates are bit for bit
                np.testing.assert_array_equal(traced, expected)
                np.testing.assert_array_equal(concrete, expected)
            else:                        # XLA's pow(beta, k): up to an ulp off Python's
                np.testing.assert_array_max_ulp(np.asarray(traced), expected, maxulp=2)
                np.testing.assert_array_max_ulp(np.asarray(concrete), expected, maxulp=2)
        # with a round decay both apply: lr decay^n d / (n + d)
        np.testing.assert_allclose(local_sgd(lr, round_decay=0.9, inverse_decay_offset=d).lr(5),
                                   lr * 0.9 ** 5 * d / (5 + d), rtol=1e-15)
    assert local_sgd(lr).lr(7) == lr           # default: no inverse-time decay


@pytest.mark.parametrize("bad, shown", [(0.0, "0.0"), (-2.0, "-2.0"), (float("inf"), "inf"),
                                        (jnp.asarray(-1.0), "-1"), ("3", "'3'")])
def test_inverse_decay_offset_is_validated_with_a_one_line_error(bad, shown):
    with pytest.raises(FljaxError) as error:
        local_sgd(0.1, inverse_decay_offset=bad)
    message = str(error.value)
    assert message == f"inverse_decay_offset must be > 0 and finite, or None, got {shown}"


M, PER_USER, DIM, CLASSES, LAM = 4, 16, 3, 3, 1.0
K_DECAY, BETA_DECAY, SEEDS = 3, 0.8, 32
CHECKPOINTS = (25, 50, 100, 200, 400)


class Softmax(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(CLASSES, name="out")(x.reshape(x.shape[0], -1))


def strongly_convex_problem():
    """4 users' softmax regression data (label skew, shifted inputs), F_i = mean CE + LAM/2
    ||theta||^2, the minimizer theta* of F = mean_i F_i (Newton, in the flattened order of the
    parameters: kernel (DIM, CLASSES) then bias) and mu, L of Assumptions 1-2."""
    rng = np.random.default_rng(1)
    owner = np.repeat(np.arange(M), PER_USER)
    y = (owner + rng.integers(0, 2, len(owner))) % CLASSES
    x = rng.normal(size=(len(owner), DIM)) + 0.5 * np.eye(DIM)[y] + 0.3 * owner[:, None]
    parts = [np.flatnonzero(owner == i) for i in range(M)]
    params = {"out": {"kernel": np.zeros((DIM, CLASSES)), "bias": np.zeros(CLASSES)}}
    inputs = np.concatenate([x, np.ones((len(x), 1))], axis=1)         # x~ = (x, 1)
    onehot = np.eye(CLASSES)[y]
    w = np.zeros((DIM + 1, CLASSES))                                   # rows: kernel, then bias
    for _ in range(30):
        logits = inputs @ w
        prob = np.exp(logits - logits.max(1, keepdims=True))
        prob /= prob.sum(1, keepdims=True)
        grad = inputs.T @ (prob - onehot) / len(y) + LAM * w
        curvature = (np.einsum("nc,cd->ncd", prob, np.eye(CLASSES))
                     - np.einsum("nc,nd->ncd", prob, prob))
        hess = (np.einsum("np,nq,ncd->pcqd", inputs, inputs, curvature) / len(y)).reshape(
            (DIM + 1) * CLASSES, -1) + LAM * np.eye((DIM + 1) * CLASSES)
        w = w - np.linalg.solve(hess, grad.ravel()).reshape(w.shape)
    assert np.abs(grad).max() < 1e-12
    star = np.concatenate([w[DIM], w[:DIM].ravel()])   # jax's leaf order: bias, then kernel
    with jax.enable_x64(True):
        data = federate(x, y, parts, CLASSES)
    # softmax CE's Hessian in the logits is <= 1/2 I: F_i is (LAM + lambda_max(E_i x~x~^T)/2)-smooth
    smooth = LAM + max(np.linalg.eigvalsh(inputs[part].T @ inputs[part] / len(part)).max()
                       for part in parts) / 2
    return data, params, star, LAM, smooth


def test_feddecay_theorem_1_error_decays_as_one_over_n():
    data, params, star, mu, smooth = strongly_convex_problem()
    last = BETA_DECAY ** (K_DECAY - 1)                           # beta_{K-1}
    c = 3 / (mu * last)
    d = max(12 * smooth / mu / last, 4 - 2 / K_DECAY)
    assert c / (d + 1) <= 1 / (4 * smooth)                       # eta_1 <= 1 / 4L
    model = from_module("softmax", Softmax(), (DIM,), CLASSES)
    offsets = [d] * SEEDS + [1e12] * SEEDS                       # the schedule; a constant lr
    with jax.enable_x64(True):
        round_fn = make_round(
            lambda h: feddecay(local_sgd(h["lr"], weight_decay=LAM,
                                         inverse_decay_offset=h["d"]), BETA_DECAY, per="step"),
            model, data, clients_per_round=M, batch_size=2, local_steps=K_DECAY,
            aggregation="uniform", runs=2 * SEEDS, run_chunk=2 * SEEDS)
        state = round_fn.init_state(params, list(range(SEEDS)) * 2,
                                    {"lr": [c / d] * (2 * SEEDS), "d": offsets})
        errors = []
        for n in range(1, CHECKPOINTS[-1] + 1):
            state, _ = round_fn(state)
            if n in CHECKPOINTS:
                ends = np.asarray(jax.vmap(lambda t: jax.flatten_util.ravel_pytree(t)[0])(
                    state.params))
                squared = np.sum((ends - star) ** 2, axis=1)
                errors.append((squared[:SEEDS].mean(), squared[SEEDS:].mean()))
    decayed, constant = np.array(errors).T
    horizon = np.array(CHECKPOINTS) + d - 2
    scaled = horizon * decayed                        # (N + d - 2) E||theta_N - theta*||^2
    assert scaled.max() < 2 * scaled.min(), scaled
    assert -1.2 < log_log_slope(horizon, decayed) < -0.8, log_log_slope(horizon, decayed)
    # a constant learning rate levels off at its noise floor: not O(1/N)
    assert log_log_slope(horizon, constant) > -0.3, log_log_slope(horizon, constant)
    assert constant[-1] > 3 * decayed[-1]


def test_lr_decay_offset_reaches_the_local_optimizer_and_bad_values_exit_2(capsys, monkeypatch):
    """--lr-decay-offset d: the algorithm's local lr in round t is lr * lr_decay**t * d / (t + d);
    0 or a negative value is a one-line error with exit code 2."""
    from fljax import algorithms
    from fljax.runner.cli import main
    from fljax.runner.config import ExperimentConfig
    from fljax.runner.experiment import make_algorithm
    from fljax.models.zoo import make_model

    made = []
    real = algorithms.local_sgd
    monkeypatch.setattr(algorithms, "local_sgd", lambda *a, **k: made.append(real(*a, **k))
                        or made[-1])
    config = ExperimentConfig().replace(lr=0.3, lr_decay=0.9, lr_decay_offset=4.0).validate()
    make_algorithm("fedavg", {}, config, make_model("mlp", (8, 8, 1), 10))
    for t in (0, 1, 7):
        np.testing.assert_allclose(made[-1].lr(t), 0.3 * 0.9 ** t * 4.0 / (t + 4.0), rtol=1e-6)
    for bad in ("0", "-1"):
        assert main(["--lr-decay-offset", bad, "--rounds", "1", "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lr_decay_offset must be > 0" in err[0], err
