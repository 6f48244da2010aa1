"""onnxruntime-genai's own decode loop as a timing peer (issue 30 item 4): what an ORT user runs.

`ort-genai:<provider>` runs a genai export (a folder holding `genai_config.json` beside its
`model.onnx`: `statebench run --model DIR/model.onnx`) through `og.Model`, `og.Generator`
and greedy search, on the CPU EP (`cpu`) or the WebGPU plugin EP (`webgpu`, registered with
`og.register_execution_provider_library`). The export's own configuration is kept: genai's
`past_present_share_buffer` and, on WebGPU, graph capture (`enableGraphCapture`, which the
builder's `enable_webgpu_graph` writes); the provider is set on `og.Config`
(`clear_providers`, then `append_provider`). Each point records them (details `genai`).

Depth is reached as a genai user reaches it: the prefix appended (`append_tokens`, in
chunks) to a fresh generator; the cache stays inside genai (a hidden cache, DESIGN §5).
A step is one token of genai's greedy loop, its logits read to the host. A model sweep's
steps are the reference's greedy tokens (``harness.sources.OrtReferenceWalk``), so genai's
own pick (the argmax of the logits it gave last, which is what its greedy search takes) is
checked against the reference's at every step:

- where they are the same token, `generate_next_token()` commits genai's pick and
  `get_logits()` runs the model on it: the two halves of one `generate_next_token()` of a
  user's loop (the model run on the token picked last, then the pick), in the other order;
  genai's committed token (`get_next_tokens()`) is checked to be that pick;
- where they differ (genai's float16 GPU logits and the reference's float32 CPU ones part at
  a near-tie), the point records it as a fact (details `genai.diverged`: the step, genai's
  token, the reference's, and genai's margin between the two in its own logits), and the
  reference's token is fed (`append_tokens`): the same model run with the token given, so
  every later step is still compared with the reference on the same prefix. Whether the
  divergence is allowed is the logits check's call, as for every backend: the argmax must
  agree wherever the reference's top-two gap is clear of the tolerance.

Which path each step took is counted per point (`genai.greedy_steps`, `forced_steps`).
Bytes: genai's session is its own, so only what crosses its interface is counted (a token
id up, the logits down); kernel traffic is not.

Presets are refused (``preset_refusal``): they are statebench's own graphs, with no
`genai_config.json`; so is a model without one, at prepare, naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from backends.base import Backend, BuildSource, DepthState, register
from backends.ort import webgpu_devices
from backends.webnn.onnx_converter import list_kv_pairs
from model.workload import Workload

try:
    import onnxruntime_genai as og
except ImportError:  # an optional dependency: the backends say so in available()
    og = None

#: genai's config file, beside the model
CONFIG = "genai_config.json"
#: tokens appended a call when reaching depth (genai chunks nothing by itself)
PREFILL_CHUNK = 512
#: the WebGPU plugin EP's name as ORT and genai know it
WEBGPU_EP = "WebGpuExecutionProvider"
_registered: dict[str, str] = {}


def _register_webgpu() -> str:
    """Register the WebGPU plugin EP's library with genai's ORT environment, once a
    process; "" or why it failed."""
    if "done" not in _registered:
        try:
            import onnxruntime_ep_webgpu

            og.register_execution_provider_library(WEBGPU_EP,
                                                   onnxruntime_ep_webgpu.get_library_path())
            _registered["done"] = ""
        except ImportError:
            _registered["done"] = "onnxruntime-ep-webgpu is not installed"
        except Exception as exc:  # noqa: BLE001 - genai raises plain RuntimeError
            _registered["done"] = ("" if "already registered" in str(exc)
                                   else f"registering the WebGPU plugin EP with genai failed: {exc}")
    return _registered["done"]


def read_config(model: Path) -> dict:
    """The genai_config.json beside ``model`` as a dict; RuntimeError naming what is wrong
    (missing, unreadable)."""
    path = model.parent / CONFIG
    if not path.is_file():
        raise RuntimeError(f"onnxruntime-genai runs a genai export: no {CONFIG} beside {model}")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{path}: not readable as JSON ({exc})") from None


def provider_options(config: dict, provider: str) -> dict[str, str]:
    """The options genai_config.json gives ``provider`` (its decoder's provider_options)."""
    listed = config.get("model", {}).get("decoder", {}).get("session_options", {}).get(
        "provider_options", [])
    out: dict[str, str] = {}
    for entry in listed if isinstance(listed, list) else []:
        for name, opts in (entry.items() if isinstance(entry, dict) else ()):
            if name.lower() == provider and isinstance(opts, dict):
                out.update({str(k): str(v) for k, v in opts.items()})
    return out


def loop_config(config: dict, provider: str) -> dict[str, object]:
    """What genai's loop runs with, as the export says: the provider, its options, graph
    capture (WebGPU's enableGraphCapture; genai captures only where the provider is one it
    appends) and past_present_share_buffer (genai's default off where not written)."""
    opts = provider_options(config, provider) if provider != "cpu" else {}
    search = config.get("search", {}) if isinstance(config.get("search"), dict) else {}
    return {"provider": provider, "provider_options": opts,
            "graph_capture": opts.get("enableGraphCapture") == "1",
            "past_present_share_buffer": bool(search.get("past_present_share_buffer", False)),
            "model_type": str(config.get("model", {}).get("type", ""))}


def in_place(model: Path, loop: dict[str, object]) -> dict[str, bool]:
    """Per cache pair (its input), whether genai's loop writes it in place, from genai's
    source: a KV pair where past_present_share_buffer binds one buffer as past and present;
    a recurrent or conv state likewise, except on WebGPU, where genai swaps two buffers
    (WebGPU forbids one buffer as a read-only input and a writable output of one pass)."""
    share = bool(loop["past_present_share_buffer"])
    return {p.input: share and (p.kind == "append" or loop["provider"] != "webgpu")
            for p in list_kv_pairs(model)}


class _GenaiBackend(Backend):
    """onnxruntime-genai's generator on one provider; subclasses set ``provider``."""

    provider = "cpu"
    hidden_state = True
    runs_models = True

    @classmethod
    def create(cls, source: BuildSource, options: None = None) -> _GenaiBackend:
        return cls(source.model_path)

    @classmethod
    def preset_refusal(cls) -> str:
        return (f"{cls.name} runs onnxruntime-genai's own loop on a genai export (a folder "
                f"with {CONFIG}: statebench run --model DIR/model.onnx), not a preset")

    @classmethod
    def available(cls) -> tuple[bool, str]:
        if og is None:
            return False, "onnxruntime-genai is not installed"
        if cls.provider == "webgpu":
            devices, why = webgpu_devices()
            if not devices:
                return False, why
            why = _register_webgpu()
            if why:
                return False, why
        return True, ""

    @classmethod
    def runs_on(cls) -> str:
        if og is None:
            return ""
        import onnxruntime as ort

        ep = "WebGPU plugin EP" if cls.provider == "webgpu" else "CPU EP"
        return f"onnxruntime-genai {og.__version__} (ONNX Runtime {ort.__version__}), {ep}"

    def __init__(self, model: str | os.PathLike | None = None) -> None:
        super().__init__()
        self.model = None if model is None else Path(model)
        self.og_model = self.params = self.generator = None
        self.position = 0
        self._logits: np.ndarray | None = None  # the logits genai gave last (its next pick's)
        self._steps = 0  # steps since the depth was reached

    def prepare(self, workload: Workload | None, capacity: int) -> None:
        if self.model is None or workload is not None:
            raise NotImplementedError(self.preset_refusal())
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        loop = loop_config(read_config(self.model), self.provider)
        config = og.Config(str(self.model.parent))
        config.clear_providers()  # the CPU EP; the provider's options stay as written
        if self.provider != "cpu":
            config.append_provider(self.provider)
        self.og_model = og.Model(config)
        self.params = og.GeneratorParams(self.og_model)
        self.params.set_search_options(max_length=capacity, do_sample=False, num_beams=1,
                                       batch_size=1)
        self.capacity = capacity
        # counted in place as the steps go (the worker reads the details after them)
        self.loop = {**loop, "version": og.__version__, "greedy_steps": 0, "forced_steps": 0}
        self.details.update(provider=self.provider, model=str(self.model))
        self.details["genai"] = self.loop
        self.details["in_place"] = in_place(self.model, loop)
        self.reset()

    def reset(self) -> None:
        self.generator = None  # the old one's buffers go before the new one's are made
        self.generator = og.Generator(self.og_model, self.params)
        self.position, self._logits, self._steps = 0, None, 0

    def reach_depth(self, depth: DepthState) -> None:
        if depth.depth >= self.capacity:
            raise ValueError(f"depth {depth.depth} leaves no room in capacity {self.capacity}")
        self.reset()
        tokens = np.asarray(depth.tokens, np.int32)
        for start in range(0, len(tokens), PREFILL_CHUNK):
            self.generator.append_tokens(tokens[start:start + PREFILL_CHUNK])
        if len(tokens):
            self._logits = self.generator.get_logits().reshape(-1)
        self.position = len(tokens)

    def step(self, token: int) -> np.ndarray:
        if self.position >= self.capacity:
            raise ValueError(f"capacity {self.capacity} exceeded at position {self.position}")
        gen = self.generator
        if self._logits is not None and token == int(np.argmax(self._logits)):
            gen.generate_next_token()  # genai's own pick, which is the token
            picked = int(gen.get_next_tokens()[0])
            if picked != token:
                raise RuntimeError(f"genai's greedy search picked {picked} where the argmax of "
                                   f"its logits is {token}")
            kind = "greedy_steps"
        else:
            if self._logits is not None:
                self._diverged(token)
            gen.append_tokens(np.array([token], np.int32))
            kind = "forced_steps"
        logits = gen.get_logits().reshape(-1)  # the greedy pick's model run, logits to host
        self._logits = logits
        self.position += 1
        self._steps += 1
        self.loop[kind] += 1
        self.counters.h2d += 4  # the token id (int32)
        self.counters.d2h += logits.nbytes
        # genai hands float32 logits whatever the graph's type: the cache attribution
        # (harness.verdicts.cache_traffic) takes these as the logits, not the graph's
        self.details["logits_bytes"] = int(logits.nbytes)
        return logits

    def _diverged(self, token: int) -> None:
        """Record the first step whose fed token is not genai's own greedy pick: the step
        (from the first after the depth), genai's pick, the token fed, and genai's margin
        between them (its logit of its pick minus its logit of the token, also relative to
        its largest |logit|): the near-tie, or not, that parted the two."""
        if "diverged" in self.loop:
            return
        logits = self._logits
        pick = int(np.argmax(logits))
        margin = float(logits[pick]) - float(logits[token])
        scale = float(np.max(np.abs(logits))) or 1.0
        self.loop["diverged"] = {"step": self._steps, "token": pick, "reference_token": token,
                                 "margin": round(margin, 6), "margin_rel": round(margin / scale, 8)}

    def close(self) -> None:
        self.generator = self.params = self.og_model = None


for _provider in ("cpu", "webgpu"):
    _cls = type(f"Genai{_provider.capitalize()}", (_GenaiBackend,), {
        "name": f"ort-genai:{_provider}", "provider": _provider, "on_cpu": _provider == "cpu",
        "__module__": __name__,
        "__doc__": f"onnxruntime-genai's greedy loop on the {_provider} provider, its export's "
                   "own configuration.",
    })
    register(_cls)
