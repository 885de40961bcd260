"""Finite differences for the reference tests: an independent check of every analytic backward."""

from __future__ import annotations

import numpy as np


def numeric_grad(loss, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``loss`` at ``x``, one element at a time."""
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        bumped = x.copy()
        bumped[index] = x[index] + step
        up = loss(bumped)
        bumped[index] = x[index] - step
        grad[index] = (up - loss(bumped)) / (2.0 * step)
    return grad
