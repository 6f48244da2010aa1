"""harness.logits.argmax: NumPy's argmax, fast on float16 logits too."""

from __future__ import annotations

import numpy as np
import pytest

from harness.logits import argmax


@pytest.mark.parametrize("scale", [1e-3, 1.0, 300.0])
def test_argmax_is_numpys_on_fresh_float16_logits(scale):
    rng = np.random.default_rng()
    for _ in range(200):
        x = (rng.standard_normal((3, 257)) * scale).astype(np.float16)
        if rng.random() < 0.5:  # a tie at the top: the first one wins
            r = rng.integers(0, 3)
            x[r, rng.integers(0, 257)] = x[r].max()
        if rng.random() < 0.3:  # every value negative
            x = -np.abs(x) - np.float16(0.5)
        np.testing.assert_array_equal(argmax(x, axis=-1), np.argmax(x, axis=-1))
        assert argmax(x[0]) == np.argmax(x[0])
        assert argmax(x.astype(np.float32)[1]) == np.argmax(x[1])


def test_argmax_orders_infinities_and_signs():
    x = np.array([-np.inf, -65504, -1, -2**-24, 2**-24, 1, 65504, np.inf], np.float16)
    for i in range(len(x)):
        assert argmax(x[: i + 1]) == i
        assert argmax(x[::-1][: i + 1]) == 0
