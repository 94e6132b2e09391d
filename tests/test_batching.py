"""Local batches: one epoch order per epoch, carried through the scan, equals drawing it per step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fljax.data.batching import batch_from_order, client_batch, epoch_order_at


@pytest.mark.parametrize("count", [1, 7, 32, 45])
def test_carried_order_equals_per_step_draw(count):
    key, batch, max_count, steps = jax.random.PRNGKey(3), 8, 45, 20

    def step(order, k):
        order = epoch_order_at(key, count, k, batch, max_count, order)
        return order, batch_from_order(order, count, k, batch, max_count)

    _, (positions, masks) = jax.lax.scan(step, jnp.zeros(max_count, jnp.int32), jnp.arange(steps))
    for k in range(steps):
        want_positions, want_mask = client_batch(key, count, k, batch, max_count)
        np.testing.assert_array_equal(positions[k], want_positions)
        np.testing.assert_array_equal(masks[k], want_mask)


def test_each_epoch_visits_every_example_once():
    count, batch, max_count = 13, 4, 20
    per_epoch = -(-count // batch)
    for epoch in range(3):
        seen = []
        for k in range(epoch * per_epoch, (epoch + 1) * per_epoch):
            positions, mask = client_batch(jax.random.PRNGKey(0), count, k, batch, max_count)
            seen += list(np.asarray(positions)[np.asarray(mask)])
        assert sorted(seen) == list(range(count))
