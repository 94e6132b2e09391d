"""FedPAQ: Reisizadeh et al., "FedPAQ: A Communication-Efficient Federated Learning Method with
Periodic Averaging and Quantization", AISTATS 2020 (Algorithm 1).

FedAvg (periodic averaging, partial participation) whose clients send their update quantized by
QSGD's unbiased low-precision quantizer with s levels (the paper's Example 1):

    w^{t+1} = w^t - sum_S p_i Q_s(w^t - y_i,K),

which is exactly ``compress(fedavg(local), "qsgd", levels=s)``; the paper averages with p_i = 1/r
(aggregation 'uniform'). Bits: ``fljax.compression.qsgd``.
"""

from __future__ import annotations

import optax

from fljax.registry import declare
from fljax.algorithms.base import Algorithm, LocalSGD
from fljax.algorithms.compress import compress
from fljax.algorithms.fedavg import fedavg


@declare(aggregation="uniform")   # the paper's / official code's unweighted mean
def fedpaq(local: LocalSGD | optax.GradientTransformation, levels: int = 1,
           bucket_size: int | None = None,
           server_optimizer: optax.GradientTransformation | None = None) -> Algorithm:
    """FedAvg with QSGD(``levels``, ``bucket_size``) on the uplink."""
    return compress(fedavg(local, server_optimizer), "qsgd", levels=levels,
                    bucket_size=bucket_size)._replace(name="fedpaq")
