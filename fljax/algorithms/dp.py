"""User-level differential privacy: DP-FedAvg's Gaussian mechanism with fixed or adaptive clipping.

McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018;
Andrew et al., "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021.

Each sampled user i sends its update Delta_i (the wrapped algorithm's message with p_i = 1),
clipped by its global l2 norm over the whole pytree:
    clip(Delta_i) = Delta_i * min(1, C^t / ||Delta_i||).
The server adds Gaussian noise once to the SUM and divides by the EXPECTED cohort size m (a fixed
denominator, not the number that joined):
    Delta~ = (sum_i clip(Delta_i) + N(0, (z_Delta C^t)^2 I)) / m,
and gives Delta~ to the wrapped algorithm's server update as its summed message.

Adaptive clipping (Andrew et al., Algorithm 1 with the centred count of their Theorem 1): each
user also sends b_i - 1/2, b_i = 1[||Delta_i|| <= C^t]; the server forms the noised share
    b~ = 1/2 + (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m
and moves C geometrically towards the target quantile gamma:
    C^{t+1} = C^t exp(-eta_C (b~ - gamma)).
The two releases together are one Gaussian mechanism of multiplier z when the update noise uses
    z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)      (Theorem 1; needs z < 2 sigma_b),
so ``fljax.privacy`` accounts the run with z either way. Fixed clipping: z_Delta = z.

Only a model-sized uplink is privatized. An algorithm whose clients send more (SCAFFOLD's
control variates, FedDyn's second sum, FedExP's norms, FedGA's first exchange) is refused: its
extra messages would leave the clients un-noised.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fljax.algorithms.base import Algorithm, ClientContext, Params, with_inner_server_state
from fljax.errors import FljaxError
from fljax.hyperparams import NON_NEGATIVE, POSITIVE, check, concrete, is_traced


class DPServerState(NamedTuple):
    inner: Any              # the wrapped algorithm's server state
    clip_norm: jax.Array    # C^t (fixed clipping: C throughout)


def clip_by_norm(update: Params, clip_norm: jax.Array) -> tuple[Params, jax.Array]:
    """(Delta * min(1, C / ||Delta||), ||Delta||): the global l2 norm over every leaf."""
    norm = optax.tree.norm(update)
    scale = jnp.where(norm > clip_norm, clip_norm / jnp.where(norm > 0, norm, 1), 1)
    return jax.tree.map(lambda leaf: (leaf * scale).astype(leaf.dtype), update), norm


def update_noise_multiplier(noise_multiplier, count_noise):
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2): the update's share of a total multiplier z when
    the clip count is released with noise std sigma_b (Andrew et al., Theorem 1)."""
    return (noise_multiplier ** -2 - (2 * count_noise) ** -2) ** -0.5


def gaussian_like(key: jax.Array, tree: Params, std: jax.Array) -> Params:
    """N(0, std^2 I) shaped like ``tree``: one key per leaf, split from ``key``."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    return treedef.unflatten([(std * jax.random.normal(k, leaf.shape, leaf.dtype)).astype(
        leaf.dtype) for k, leaf in zip(keys, leaves)])


def dp(algorithm: Algorithm, clip_norm: float, noise_multiplier: float, cohort_size: int, *,
       target_quantile: float | None = None, clip_learning_rate: float = 0.2,
       count_noise: float | None = None) -> Algorithm:
    """``algorithm`` under user-level DP (module docstring): updates clipped to ``clip_norm`` C,
    Gaussian noise of total multiplier ``noise_multiplier`` z on their sum, divided by
    ``cohort_size`` m, the expected cohort (clients_per_round, the mean cohort under Bernoulli
    participation too). ``target_quantile`` gamma turns on adaptive clipping from C^0 = C with
    step ``clip_learning_rate`` eta_C and count noise ``count_noise`` sigma_b (default m / 20,
    the paper's). z = 0 adds no noise (clipping alone)."""
    check("clip_norm", clip_norm, POSITIVE, "> 0 and finite")
    check("noise_multiplier", noise_multiplier, NON_NEGATIVE, ">= 0 and finite")
    if isinstance(cohort_size, bool) or not isinstance(cohort_size, int) or cohort_size < 1:
        raise FljaxError(f"cohort_size must be a whole number >= 1, got {cohort_size!r}")
    if algorithm.perturb is not None:
        raise FljaxError(f"dp cannot wrap {algorithm.name}: it adds server noise of its own")
    if algorithm.aggregate is not None:
        raise FljaxError(f"dp cannot wrap {algorithm.name}: its cohort is aggregated side by "
                         f"side (robust, byzantine), and the privacy argument needs the noised "
                         f"SUM of the clipped updates")
    if algorithm.cohort_start is not None:
        raise FljaxError(f"dp cannot privatize {algorithm.name}: its clients send a first "
                         f"message (cohort_start) that would leave them un-noised")
    adaptive = target_quantile is not None
    if adaptive:
        check("target_quantile", target_quantile, lambda v: 0 <= v <= 1, "in [0, 1]")
        check("clip_learning_rate", clip_learning_rate, POSITIVE, "> 0 and finite")
        count_noise = cohort_size / 20 if count_noise is None else count_noise
        check("count_noise", count_noise, POSITIVE, "> 0 and finite")
        z, sigma_b = concrete(noise_multiplier), concrete(count_noise)
        if not (is_traced(noise_multiplier) or is_traced(count_noise)) and z >= 2 * sigma_b:
            raise FljaxError(f"noise_multiplier must be below 2 * count_noise = {2 * sigma_b:g} "
                             f"with adaptive clipping (the clip count would spend the whole "
                             f"budget), got {z:g}")
    elif count_noise is not None:
        raise FljaxError("count_noise is set but target_quantile is not: only adaptive clipping "
                         "releases a clip count")

    def inner_view(ctx: ClientContext) -> ClientContext:
        return ctx._replace(server_state=ctx.server_state.inner)

    def server_init(params):
        dtype = jax.tree.leaves(params)[0].dtype
        return DPServerState(algorithm.server_init(params), jnp.asarray(clip_norm, dtype))

    def client_end(ctx: ClientContext, start, end):
        if not isinstance(ctx.cohort_size, jax.Array) and ctx.cohort_size != cohort_size:
            raise FljaxError(f"dp's cohort_size {cohort_size} differs from the round's cohort "
                             f"of {ctx.cohort_size} clients")
        view = inner_view(ctx)
        state, update = algorithm.client_end(view._replace(weight=jnp.ones_like(ctx.weight)),
                                             start, end)
        if jax.tree.structure(update) != jax.tree.structure(ctx.params) or any(
                jnp.shape(u) != jnp.shape(p) for u, p in zip(jax.tree.leaves(update),
                                                            jax.tree.leaves(ctx.params))):
            raise FljaxError(f"dp cannot privatize {algorithm.name}: its clients send more than "
                             f"one model-sized update, and the rest would leave them un-noised")
        clipped, norm = clip_by_norm(update, ctx.server_state.clip_norm)
        count = (norm <= ctx.server_state.clip_norm).astype(norm.dtype) - 0.5
        return state, (clipped, count)

    def perturb(message, server_state: DPServerState, key: jax.Array):
        summed, count = message
        update_key, count_key = jax.random.split(key)
        z = noise_multiplier
        if adaptive:
            z = update_noise_multiplier(noise_multiplier, count_noise)
            count = count + count_noise * jax.random.normal(count_key, (), count.dtype)
        noise = gaussian_like(update_key, summed, z * server_state.clip_norm)
        noised = jax.tree.map(lambda s, n: ((s + n) / cohort_size).astype(s.dtype), summed,
                              noise)
        return noised, count

    def server_update(params, server_state: DPServerState, message, round_index):
        update, count = message
        params, inner = algorithm.server_update(params, server_state.inner, update, round_index)
        clip = server_state.clip_norm
        if adaptive:
            below = 0.5 + count / cohort_size                                    # b~
            clip = (clip * jnp.exp(-clip_learning_rate * (below - target_quantile))).astype(
                clip.dtype)
        return params, DPServerState(inner, clip)

    def client_metrics(ctx: ClientContext, start, end):
        return {**algorithm.client_metrics(inner_view(ctx), start, end),
                "clip_norm": ctx.server_state.clip_norm}

    return with_inner_server_state(
        algorithm, name=f"{algorithm.name}+dp", server_init=server_init, client_end=client_end,
        server_update=server_update, perturb=perturb, client_metrics=client_metrics,
        rebase=None)
