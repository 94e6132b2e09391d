"""The interaction tensor (Jiang et al. 2024) of a round's models, as FedDyn as initialization
(Anonymous, 2024) section 3.3 and appendix A.2 use it: which features the global model, the local
models and the next global model learned, and on which data points.

For M models (w^t, the local models of the cohort, w^{t+1}: M = |P_t| + 2) and N data points:

1. features: the penultimate representation Phi_m (N x d) of model m, centered; its top-K
   principal components V_m (the first K right singular vectors of Phi_m = U S V^T) give the
   projections v_m(x) = Phi_m V_m[:, :K] (N x K); feature (m, k) is column k;
2. clusters: the Pearson correlation rho of every pair of features over the N points (Eq. (2));
   greedy clustering in order (model by model, component by component): an unassigned feature
   opens a cluster and takes every unassigned feature with |rho| > gamma_corr;
3. data: each v_{m,k} divided by its l_inf norm over the points; point n contains feature (m, k)
   when |v_{m,k}(x_n)| / max_n |v_{m,k}| > gamma_data, the 90th percentile of all those normalized
   entries (the paper's choice);
4. Omega[m, n, f] = 1 when model m has a feature k in cluster f and point n contains it.

Choices where the paper is silent (said here): the features are centered before the SVD (PCA);
containment uses the absolute projection (a component's sign is arbitrary); the greedy order is
model by model, component by component, each cluster seeded by its first feature.

The probe ``interaction_tensor(points, rounds)`` keeps every client's latest local model and the
round it was trained (N x params) and the previous global model, and after each round in
``rounds`` logs ``interaction_clusters`` (F, Figure 2), ``interaction_local_shared`` (features of
the current global model that a local model still has, mean over the cohort: Figures 3a, 5a),
``interaction_next_shared`` (shared by the current and the next global model: Figures 3b, 5b)
and, for an algorithm whose evaluation has a ``gamma`` model (FedDyn's aggregate before the h
correction), ``interaction_gamma_shared`` (Figure 5c); it writes Omega and the cluster labels to
``OUT_DIR/interaction_tensor/round_T.npz``.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fljax.errors import FljaxError
from fljax.probes.base import ClientView, EvalView, Probe, RoundView, stacked


def principal_projections(features: np.ndarray, k: int) -> np.ndarray:
    """v(x) = Phi V_K: the N points projected on the top-k principal components (N x k)."""
    centered = np.asarray(features, np.float64) - np.mean(features, axis=0)
    if min(centered.shape) < k:
        raise FljaxError(f"interaction tensor: K = {k} components need at least {k} points and "
                         f"feature dimensions, got features of shape {features.shape}")
    _, _, vt = np.linalg.svd(centered, full_matrices=False)
    return centered @ vt[:k].T


def greedy_clusters(projections: Sequence[np.ndarray], gamma_corr: float) -> np.ndarray:
    """Cluster labels (M x K) of the M*K features by |correlation| > gamma_corr, greedily."""
    stacked_features = np.concatenate(projections, axis=1)
    correlated = np.abs(np.corrcoef(stacked_features, rowvar=False)) > gamma_corr
    labels = np.full(stacked_features.shape[1], -1)
    clusters = 0
    for feature in range(len(labels)):
        if labels[feature] < 0:
            members = (labels < 0) & correlated[feature]
            members[feature] = True
            labels[members] = clusters
            clusters += 1
    return labels.reshape(len(projections), -1)


def containment(projections: Sequence[np.ndarray], quantile: float) -> np.ndarray:
    """contains[m, n, k]: |v_{m,k}(x_n)| / max_n |v_{m,k}| above its ``quantile`` over all
    entries."""
    magnitude = np.abs(np.stack(projections))                     # M x N x K
    normalized = magnitude / np.maximum(magnitude.max(axis=1, keepdims=True), 1e-300)
    return normalized > np.quantile(normalized, quantile)


class InteractionTensor(NamedTuple):
    omega: np.ndarray      # [M, N, F] bool
    labels: np.ndarray     # [M, K] cluster of each model's features

    @property
    def num_clusters(self) -> int:
        return self.omega.shape[2]

    def shared(self, a: int, b: int) -> int:
        """Clusters that models a and b both have."""
        return len(set(self.labels[a]) & set(self.labels[b]))


def interaction_tensor_of(features: Sequence[np.ndarray], k: int = 20, gamma_corr: float = 0.5,
                          gamma_data: float = 0.9) -> InteractionTensor:
    """Omega of M models from their penultimate features on the same N points (module doc)."""
    projections = [principal_projections(f, k) for f in features]
    labels = greedy_clusters(projections, gamma_corr)
    contains = containment(projections, gamma_data)
    num_clusters = int(labels.max()) + 1
    omega = np.zeros((len(features), contains.shape[1], num_clusters), bool)
    for m in range(len(features)):
        for component in range(k):
            omega[m, :, labels[m, component]] |= contains[m, :, component]
    return InteractionTensor(omega, labels)


class LatestLocal(NamedTuple):
    model: object        # the client's latest local model y_k,K
    round: jax.Array     # shape=(), int32: the round it was trained in (-1: never)


def interaction_tensor(points: np.ndarray, rounds: Sequence[int], *, k: int = 20,
                       gamma_corr: float = 0.5, gamma_data: float = 0.9) -> Probe:
    """The interaction tensor of w^{T-1}, the cohort's local models of round T and w^T after each
    round T in ``rounds``, on the penultimate features of ``points``."""
    rounds = tuple(int(r) for r in rounds)
    if not rounds or min(rounds) < 1:
        raise FljaxError(f"interaction_tensor: rounds must be round numbers >= 1, got {rounds}")
    if not 0 < gamma_corr < 1 or not 0 < gamma_data < 1:
        raise FljaxError(f"interaction_tensor: gamma_corr and gamma_data must lie in (0, 1), got "
                         f"{gamma_corr}, {gamma_data}")
    points = np.asarray(points)

    def init(params, num_clients):
        copy = jax.tree.map(lambda p: jnp.array(p, copy=True), params)
        return copy, stacked(num_clients, LatestLocal(params, -jnp.ones((), jnp.int32)))

    def client(view: ClientView):
        return LatestLocal(view.end, view.ctx.round.astype(jnp.int32)), ()

    def server(view: RoundView):
        return view.params, {}          # keep w^t: after the next round it is the previous one

    def evaluate(view: EvalView) -> dict[str, float]:
        if view.round not in rounds:
            return {}
        previous, latest = jax.device_get(view.probe_state)
        cohort = np.flatnonzero(np.asarray(latest.round) == view.round - 1)
        local = [jax.tree.map(lambda a: a[c], latest.model) for c in cohort]
        models = [previous, *local, jax.device_get(view.state.params)]
        features = [np.asarray(view.model.apply_with_features(m, points)[0]) for m in models]
        tensor = interaction_tensor_of(features, k, gamma_corr, gamma_data)
        last = len(models) - 1
        scores = {"interaction_clusters": tensor.num_clusters,
                  "interaction_local_shared": float(np.mean([tensor.shared(0, m)
                                                             for m in range(1, last)])),
                  "interaction_next_shared": tensor.shared(0, last)}
        named = view.algorithm.eval_models(view.state.params, view.state.server_state)
        if "gamma" in named:
            gamma = np.asarray(view.model.apply_with_features(named["gamma"], points)[0])
            with_gamma = interaction_tensor_of([*features[:-1], gamma], k, gamma_corr,
                                               gamma_data)
            scores["interaction_gamma_shared"] = with_gamma.shared(0, last)
        if view.out_dir is not None:
            folder = os.path.join(view.out_dir, "interaction_tensor")
            os.makedirs(folder, exist_ok=True)
            np.savez_compressed(os.path.join(folder, f"round_{view.round}.npz"),
                                omega=tensor.omega, labels=tensor.labels,
                                clients=cohort, round=view.round)
        return scores

    return Probe(name="interaction_tensor", init=init, client=client, server=server,
                 evaluate=evaluate, eval_rounds=rounds)
