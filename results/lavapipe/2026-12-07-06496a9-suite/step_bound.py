"""The float16 Qwen3.5 test export on the stateful page with the GPU plan forced (48 storage
buffers, the combine a launch), against ORT CPU on its reference graph: ROUNDS rounds of 6
fresh random tokens from an empty cache; prints steps over 2 tolerances or off the argmax
band, and the distribution of max|d|/max|ref| over all steps. Run from the repository root:
.venv/bin/python results/lavapipe/2026-12-07-06496a9-suite/step_bound.py 80"""
import dataclasses, json, sys
import numpy as np
sys.path[:0] = ["tests", "."]
from pathlib import Path
from backends.base import registry
from backends.webnn.wgpu_impl import context
from backends.webnn.wgpu_impl.options import KernelOptions
from harness.model_run import UserModel, backend_for, reference_graph
import tempfile
path = Path("tests/models-float16/genai-q4f16-qwen35-small/model.onnx")
model = UserModel.load(path)
tmp = Path(tempfile.mkdtemp())
(tmp / "ref").mkdir()
oracle = backend_for(registry()["ort-cpu:copy"], reference_graph(model, tmp / "ref"), None)
real = context.target_of
context.target_of = lambda *a: dataclasses.replace(real(*a), cpu=False, max_storage=48, shared_bytes=32768)
page = backend_for(registry()["wgpu:stateful"], path, None, KernelOptions(attention_combine="launch"))
vocab = json.loads((path.parent / "genai_config.json").read_text())["model"]["vocab_size"]
rng = np.random.default_rng()
print("tol", model.tolerance)
allrels = []
for b in (oracle, page):
    b.prepare(None, 16)
for r in range(int(sys.argv[1])):
    for b in (oracle, page):
        b.reset()
    rels = []
    for i, tok in enumerate(rng.integers(1, vocab, 6)):
        want = np.asarray(oracle.step(int(tok)), np.float64).reshape(-1)
        got = np.asarray(page.step(int(tok)), np.float64).reshape(-1)
        rel = np.abs(got - want).max() / np.abs(want).max()
        band = 2 * model.tolerance * np.abs(want).max()
        am = want[got.argmax()] >= want.max() - band
        rels.append(rel)
        if rel > 2*model.tolerance or not am:
            print("round", r, "step", i, "rel %.2e" % rel, "argmax ok", am, flush=True)
    if np.median(rels) >= model.tolerance:
        print("round", r, "median %.2e" % np.median(rels), flush=True)
    allrels += rels
a = np.array(allrels)
print("n", len(a), "max %.2e" % a.max(), "p99 %.2e" % np.quantile(a, .99), "median %.2e" % np.median(a))
