"""Where genai-q4f16-qwen35-d256's outlier step on the CPU plan comes from (lavapipe, 2 cores):
each part prints JSON lines.

    .venv/bin/python results/lavapipe/2026-12-06-63cd189-outlier/outlier.py steps \
        /tmp/heldout/genai-q4f16-qwen35-d256/model.onnx
    .venv/bin/python results/lavapipe/2026-12-06-63cd189-outlier/outlier.py detail \
        /tmp/heldout/genai-q4f16-qwen35-d256/model.onnx
    .venv/bin/python results/lavapipe/2026-12-06-63cd189-outlier/outlier.py seeds \
        /tmp/heldout/genai-q4f16-qwen35-d256/model.onnx 12

The truth is the twelfth session's (``../2026-12-06-ad6c322/measure.py``: the export widened
to float32, ORT's CPU EP), on the same 40 tokens (seed 7). ``steps``: every step is also run
from a given state: the page (``wgpu:stateless``, its host cache overwritten before the step)
and ORT's float16 run of the reference's copy (``ORT16``) from the truth's state rounded to
float16, and from each other's state; the float32 graph from each of those states (``exact``:
what that state alone costs); the conv state at the worst step against the truth's rounded
to float16; layer 0's conditioning at each step (the largest |q_h . k_h| of its two
gated-delta heads after their L2 norms, and the largest decay exp(g)); and what rounding only
the token's layer-0 qkv projection to float16 (the graph's float16 output) costs the float32
graph at the worst step. ``detail`` (step 22 of seed 7): the float32 graph from the truth's
state with one pair rounded to float16; ORT16's conv window against the float32 graph's with
layer 0's RMSNorm output and qkv product rounded to float16; one float16 ULP added to one
conv-window value (channel 11, newest row) and what it moves (LinearAttention output,
GatedRMSNorm output, logits: max|Δ|/max|x|); the cosines between the logits errors of the
rounded state (exact), the page's step and ORT16's step (each beyond exact, same state);
the steps where the page's step from the rounded truth state is worse than ORT16's.
``seeds``: ORT16 and the stateful page's CPU plan against the truth
on 40 random tokens of seeds 0..N-1 (median and worst step).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "2026-12-06-ad6c322")]

import measure as M  # noqa: E402  (puts the repository on the path)

from backends.base import registry  # noqa: E402
from harness.model_run import UserModel, backend_for, reference_graph  # noqa: E402

KV = ("past_key_values.1.key", "past_key_values.1.value")
L0 = "/model/layers.0/linear_attn/"


def session(path, extra=(), cast=()):
    """ORT on ``path`` with ``extra`` tensors as outputs and each tensor of ``cast`` rounded
    to float16 (a Cast pair) before its readers."""
    m = onnx.load(str(path))
    for t in cast:
        for n in m.graph.node:
            for i, x in enumerate(n.input):
                if x == t:
                    n.input[i] = t + "/r"
        m.graph.node.extend([onnx.helper.make_node("Cast", [t], [t + "/h"], to=TensorProto.FLOAT16),
                             onnx.helper.make_node("Cast", [t + "/h"], [t + "/r"],
                                                   to=TensorProto.FLOAT)])
    for e in extra:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(e))
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_step(sess, state, token, pos, dtype):
    feed = {k: v.astype(dtype) for k, v in state.items()}
    feed.update(input_ids=np.array([[token]], np.int64),
                attention_mask=np.ones((1, pos + 1), np.int64),
                position_ids=np.full((3, 1, 1), pos, np.int64))
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))
    state = {"past_key_values.1.key": out["present.1.key"],
             "past_key_values.1.value": out["present.1.value"],
             "past.0.conv": out["present.0.conv"], "past.0.recurrent": out["present.0.recurrent"]}
    return out["logits"].astype(np.float64).reshape(-1), state, out


def ort_walk(sess, tokens, dtype, extra=False):
    state = {k: np.zeros((1, 1, 0, 256), dtype) for k in KV}
    state.update({"past.0.conv": np.zeros((1, 256, 3), dtype),
                  "past.0.recurrent": np.zeros((1, 4, 32, 32), dtype)})
    logits, states, outs = [], [], []
    for i, t in enumerate(tokens):
        states.append(state)
        lg, state, out = ort_step(sess, state, int(t), i, dtype)
        logits.append(lg)
        outs.append(out)
    return logits, states, outs


class Page:
    """The stateless page, whose host cache a step may start from any state."""

    def __init__(self, path):
        self.b = backend_for(registry()["wgpu:stateless"], path, None)
        self.b.prepare(None, 64)

    def walk(self, tokens, given=None):
        """Logits of each step and the state each started from (ORT's layout); ``given``:
        step -> the state to start that step from."""
        logits, states = [], []
        host = self.b._host
        for i, t in enumerate(tokens):
            if given and i in given:
                for k, v in given[i].items():
                    if k in KV:
                        host[k][...] = 0
                        host[k][:, :, :i] = v
                    else:
                        host[k][...] = v
            states.append({k: (host[k][:, :, :i] if k in KV else host[k]).astype(np.float32)
                           for k in host})
            logits.append(np.asarray(self.b.step(int(t)), np.float64).reshape(-1))
        return logits, states

    def close(self):
        self.b.close()


def one(x, want):
    return float(np.abs(x - want).max() / np.abs(want).max())


def steps(path_s: str) -> None:
    path = Path(path_s)
    f32 = Path(tempfile.mkdtemp()) / "model.onnx"
    M.widened(path, f32)
    ref = reference_graph(UserModel.load(path), Path(tempfile.mkdtemp()))
    tokens = np.random.default_rng(7).integers(1, 500, 40)
    q, k, g = (L0 + "q_l2norm/LpNormalization/output_0", L0 + "k_l2norm/LpNormalization/output_0",
               L0 + "LinearAttentionGate/output_0")
    s32, s16 = session(f32, (q, k, g)), session(ref)
    want, truth, outs = ort_walk(s32, tokens, np.float32)
    o16, st16, _ = ort_walk(s16, tokens, np.float16)
    page = Page(path)
    p16, stp = page.walk(tokens)
    page.close()
    worst = int(np.argmax([one(a, b) for a, b in zip(p16, want, strict=True)]))
    rounded = [{n: v.astype(np.float16).astype(np.float32) for n, v in s.items()} for s in truth]
    page = Page(path)
    from_truth, _ = page.walk(tokens, dict(enumerate(rounded)))
    page.close()
    w = want[worst]
    runs = {
        "page, own state": p16,
        "ORT16, own state": o16,
        "page from the rounded truth state": from_truth,
        "ORT16 from the rounded truth state": [ort_step(s16, s, int(t), i, np.float16)[0]
                                               for i, (s, t) in enumerate(zip(rounded, tokens, strict=True))],
        "exact from the rounded truth state": [ort_step(s32, s, int(t), i, np.float32)[0]
                                               for i, (s, t) in enumerate(zip(rounded, tokens, strict=True))],
        "exact from the page's state": [ort_step(s32, s, int(t), i, np.float32)[0]
                                        for i, (s, t) in enumerate(zip(stp, tokens, strict=True))],
        "exact from ORT16's state": [ort_step(s32, s, int(t), i, np.float32)[0]
                                     for i, (s, t) in enumerate(zip(st16, tokens, strict=True))],
    }
    for label, got in runs.items():
        r = [one(a, b) for a, b in zip(got, want, strict=True)]
        print(json.dumps({"part": "steps", "run": label, "median": float(np.median(r)),
                          "max": max(r), "max_step": int(np.argmax(r)), "worst_step": r[worst]}))
    page = Page(path)
    cross = {"page from ORT16's state": page.walk(tokens[:worst + 1], {worst: st16[worst]})[0][worst]}
    page.close()
    cross["ORT16 from the page's state"] = ort_step(s16, stp[worst], int(tokens[worst]), worst,
                                                     np.float16)[0]
    print(json.dumps({"part": "cross", "step": worst, **{a: one(b, w) for a, b in cross.items()}}))
    exact = truth[worst]["past.0.conv"].astype(np.float16)
    print(json.dumps({"part": "conv_state", "step": worst, "elements": int(exact.size), **{
        f"{label} != truth rounded": int((s[worst]["past.0.conv"] != exact.astype(np.float32)).sum())
        for label, s in (("page", stp), ("ORT16", st16))}}))
    qk = [max(abs(float(np.dot(o[q].reshape(2, 32)[h], o[k].reshape(2, 32)[h]))) for h in (0, 1))
          for o in outs]
    decay = [float(np.exp(o[g]).max()) for o in outs]
    order = np.argsort(qk)
    print(json.dumps({"part": "conditioning", "median_max_qk": float(np.median(qk)),
                      "smallest": [{"step": int(s), "max_qk": qk[s], "max_decay": decay[s]}
                                   for s in order[:4]]}))
    sq = session(f32, cast=[L0 + "qkv_proj/MatMul/output_0"])
    e = ort_step(sq, rounded[worst], int(tokens[worst]), worst, np.float32)[0]
    x = runs["exact from the rounded truth state"][worst]
    print(json.dumps({"part": "qkv_rounding", "step": worst,
                      "exact, qkv projection rounded, from the rounded truth state": one(e, w),
                      "its cost alone": float(np.abs(e - x).max() / np.abs(w).max()),
                      "page's step alone (page minus exact, same state)":
                      float(np.abs(from_truth[worst] - x).max() / np.abs(w).max())}))


def detail(path_s: str) -> None:
    path = Path(path_s)
    f32 = Path(tempfile.mkdtemp()) / "model.onnx"
    M.widened(path, f32)
    ref = reference_graph(UserModel.load(path), Path(tempfile.mkdtemp()))
    tokens = np.random.default_rng(7).integers(1, 500, 40)
    step, tok = 22, int(tokens[22])
    la, gn = L0 + "LinearAttention/output_0", L0 + "GatedRMSNorm/output_0"
    s32, s16 = session(f32, (la, gn)), session(ref)
    want, truth, _ = ort_walk(s32, tokens, np.float32)
    w, st = want[step], truth[step]
    out = {"part": "detail", "step": step}
    for name in st:
        one_rounded = dict(st, **{name: st[name].astype(np.float16).astype(np.float32)})
        out[f"exact, only {name} rounded"] = one(ort_step(s32, one_rounded, tok, step, np.float32)[0], w)
    _, st16, _ = ort_walk(s16, tokens, np.float16)
    sr = session(f32, cast=["/model/layers.0/input_layernorm/output_0", L0 + "qkv_proj/MatMul/output_0"])
    _, str_, _ = ort_walk(sr, tokens, np.float32)
    out["ORT16's conv window != float32 graph's with norm and product rounded"] = int(
        (st16[step]["past.0.conv"].astype(np.float32) != str_[step]["past.0.conv"]).sum())
    lg0, _, o0 = ort_step(s32, st, tok, step, np.float32)
    conv = st["past.0.conv"].copy()
    conv[0, 11, 2] += float(np.spacing(np.float16(conv[0, 11, 2])))
    lg1, _, o1 = ort_step(s32, dict(st, **{"past.0.conv": conv}), tok, step, np.float32)
    out["one ULP of conv[11, newest]"] = {
        n: float(np.abs(o1[t] - o0[t]).max() / np.abs(o0[t]).max())
        for n, t in (("LinearAttention", la), ("GatedRMSNorm", gn), ("logits", "logits"))}
    rounded = {n: v.astype(np.float16).astype(np.float32) for n, v in st.items()}
    exact = ort_step(s32, rounded, tok, step, np.float32)[0]
    page = Page(path)
    pg = page.walk(tokens[:step + 1], {step: rounded})[0][step]
    page.close()
    o16 = ort_step(s16, rounded, tok, step, np.float16)[0]

    def cos(a, b):
        return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))

    out["cosines"] = {"state, page's step": cos(exact - w, pg - exact),
                      "state, ORT16's step": cos(exact - w, o16 - exact),
                      "page's step, ORT16's step": cos(pg - exact, o16 - exact)}
    rounded_all = [{n: v.astype(np.float16).astype(np.float32) for n, v in s.items()} for s in truth]
    page = Page(path)
    pr = page.walk(tokens, dict(enumerate(rounded_all)))[0]
    page.close()
    worse = []
    for i, (s, t) in enumerate(zip(rounded_all, tokens, strict=True)):
        a, b = one(pr[i], want[i]), one(ort_step(s16, s, int(t), i, np.float16)[0], want[i])
        if a > b:
            worse.append({"step": i, "page": a, "ORT16": b})
    out["page's step worse than ORT16's (same rounded truth state)"] = worse
    print(json.dumps(out))


def seeds(path_s: str, n: str) -> None:
    path = Path(path_s)
    f32 = Path(tempfile.mkdtemp()) / "model.onnx"
    M.widened(path, f32)
    ref = reference_graph(UserModel.load(path), Path(tempfile.mkdtemp()))
    for seed in range(int(n)):
        tokens = np.random.default_rng(seed).integers(1, 500, 40)
        want = M.steps(f32, "ort-cpu:copy", tokens)
        out = {"part": "seeds", "seed": seed}
        for label, got in (("ORT16", M.steps(ref, "ort-cpu:copy", tokens)),
                           ("page_cpu_plan", M.steps(path, "wgpu:stateful", tokens))):
            r = M.rel(got, want)
            out[label] = {"median": float(np.median(r)), "max": max(r),
                          "max_step": int(np.argmax(r))}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    {"steps": steps, "detail": detail, "seeds": seeds}[sys.argv[1]](*sys.argv[2:])
