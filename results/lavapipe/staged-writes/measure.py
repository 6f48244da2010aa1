"""A hybrid stateless page's write batch on this machine's adapter, both ways a small write may
treat the staged batch: "flush" (every small write submits it first, as before c64dc8c) and
"holds" (only where the batch writes the same tensor, the default since). The batch: 12 x
(a 48 KB float16 convolution state, queued, then a 2 MiB float32 recurrent state, staged) and
8 x 512 KB float16 caches (queued), hybrid-1b+q4f16's states at 512, then one small read (the
wait for all of it). Prints JSON: per way, the median batch time of 25 (after 5 warm-up
batches) and the staged submits a batch, for the way named, in a process of its own.

    for i in 1 2 3; do for w in flush holds; do
      .venv/bin/python results/lavapipe/staged-writes/measure.py $w; done; done > runs.jsonl
"""

import json
import time

import numpy as np

from backends.webnn import ml
from harness.calibrate import provenance


def batch_ms(how: str) -> dict:
    ctx = ml.create_context()
    if how == "flush":
        ctx._staged.holds = lambda dst: True  # the former rule: every small write flushes
    rng = np.random.default_rng(0)
    made = [("float32", 512 * 1024)] * 12 + [("float16", 8192 * 3)] * 12 + [("float16", 2 * 256 * 512)] * 8
    tensors = [ctx.create_tensor(data_type=t, shape=[n], writable=True, readable=True) for t, n in made]
    data = [rng.standard_normal(n).astype(t) for t, n in made]
    big, conv, kv = range(12), range(12, 24), range(24, 32)
    times, submits = [], []
    for rep in range(30):
        s0, t0 = ctx._staged.submits, time.perf_counter()
        for i in range(12):
            ctx.write_tensor(tensors[conv[i]], data[conv[i]])
            ctx.write_tensor(tensors[big[i]], data[big[i]])
            if i % 3 == 2:
                for j in kv[2 * (i // 3):2 * (i // 3) + 2]:
                    ctx.write_tensor(tensors[j], data[j])
        ctx._staged.flush()
        ctx.read_tensor(tensors[conv[0]])
        if rep >= 5:
            times.append((time.perf_counter() - t0) * 1e3)
            submits.append(ctx._staged.submits - s0)
    ctx.destroy()
    return {"median_ms": round(float(np.median(times)), 3), "staged_submits": int(np.median(submits))}


if __name__ == "__main__":
    import sys

    how = sys.argv[1]  # "flush" or "holds": one way a process, so neither warms the other
    print(json.dumps({"provenance": provenance(), "way": how, **batch_ms(how)}))
