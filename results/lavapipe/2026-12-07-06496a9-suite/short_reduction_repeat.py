"""The short-reduction test (tests/test_webnn_ops.py) run 150 times each for reduce_sum and
reduce_mean on one wgpu context, fresh random inputs each time; prints each failure and the
count. Run from the repository root."""
import sys, numpy as np
sys.path[:0] = ["tests", "."]
import test_webnn_ops as t
from backends.webnn import ml
c = ml.create_context(engine="wgpu"); c.record_ahead = True
fails = 0
for i in range(150):
    for op, ref in (("reduce_sum", np.sum), ("reduce_mean", np.mean)):
        try:
            t.test_short_reduction_is_computed_where_its_activation_reads_it(c, op, ref)
        except AssertionError as e:
            fails += 1; print(op, str(e)[:200])
print("fails", fails)
