"""The greedy pick from logits in the type a backend hands them (float32, or float16 where
the graph's logits are: ``Backend.step``).

NumPy compares float16 elements one by one in software, so ``np.argmax`` over a large
vocabulary's float16 logits is far slower than over float32 ones or than widening them first,
which a loop that times its argmax would charge to the backend. Float16 bit patterns read as
int16 order like the values once a negative one's magnitude bits are flipped, so the pick is
an integer argmax over the same 2 bytes an element.
"""

from __future__ import annotations

import numpy as np


def argmax(logits: np.ndarray, axis: int = -1) -> np.ndarray | np.intp:
    """``np.argmax(logits, axis)``, the first of equal maxima, for float16 logits too.

    For float16: NaN sorts above +inf (NumPy's argmax also picks a NaN), and -0.0 one
    step below +0.0 (NumPy counts them equal: the two differ only where the largest
    logit is a zero of both signs)."""
    a = np.asarray(logits)
    if a.dtype != np.float16:
        return np.argmax(a, axis=axis)
    bits = a.view(np.int16)
    return np.argmax(bits ^ ((bits >> 15) & np.int16(0x7FFF)), axis=axis)
