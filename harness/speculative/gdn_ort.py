"""ORT as the GDN engine: GatedDeltaNet as the verify pass (final state and compact
capsule in one dispatch) and GatedDeltaNetStateReplay on the WebGPU EP, where it finds a device."""

from __future__ import annotations

import numpy as np

from harness.speculative.counters import CAPTURE_COUNT_BYTES, F32, REPLAY_METADATA_BYTES, SpecBytes
from harness.speculative.drafts import Draft, GdnShape
from harness.versions import package_version


def _ort():
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - the venv always has it
        return None
    return ort


def verify_model(sh: GdnShape, capacity: int) -> bytes:
    """One com.microsoft GatedDeltaNet node: log-space decay, effective beta, qk_l2_norm=1,
    V-major state, compact capture of `capture_count` ≤ `state_update_capacity` tokens."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node(
        "GatedDeltaNet",
        ["query", "key", "value", "", "decay", "beta", "initial_state", "", "", "capture_count"],
        ["output", "final_state", "state_update"], domain="com.microsoft",
        state_update_capacity=capacity, gate_activation="none", beta_activation="none",
        qk_l2_norm=1)
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "gdn_verify",
        [vi("query", f, ["T", sh.hk, sh.dk]), vi("key", f, ["T", sh.hk, sh.dk]),
         vi("value", f, ["T", sh.hv, sh.dv]), vi("decay", f, ["T", sh.hv]),
         vi("beta", f, ["T", sh.hv]), vi("initial_state", f, [1, sh.hv, sh.dv, sh.dk]),
         vi("capture_count", TensorProto.INT32, [1])],
        [vi("output", f, ["T", sh.hv, sh.dv]), vi("final_state", f, [1, sh.hv, sh.dv, sh.dk]),
         vi("state_update", f, [1, capacity * sh.capsule_row_floats])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def replay_model() -> bytes:
    """One com.microsoft GatedDeltaNetStateReplay node over rank-1 FP32 backings."""
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node(
        "GatedDeltaNetStateReplay",
        ["source_backing", "capsule_backing", "destination_backing", "metadata"],
        ["destination_out"], domain="com.microsoft")
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "gdn_replay",
        [vi("source_backing", f, ["N"]), vi("capsule_backing", f, ["M"]),
         vi("destination_backing", f, ["N"]), vi("metadata", TensorProto.INT64, [11])],
        [vi("destination_out", f, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def replay_metadata(sh: GdnShape, capacity: int, kept: int) -> np.ndarray:
    """source, destination, decay, key, delta offsets (FP32 elements), Hv, Dv, Dk, Hk, C, kept.
    Source and destination are separate backings at offset 0; the capsule is its own backing."""
    key_off = capacity * sh.hv
    delta_off = key_off + capacity * sh.hk * sh.dk
    return np.array([0, 0, 0, key_off, delta_off, sh.hv, sh.dv, sh.dk, sh.hk, capacity, kept],
                    np.int64)


class OrtVerify:
    """ORT's GatedDeltaNet as the verify pass: final state and compact capsule in one dispatch."""

    def __init__(self, sh: GdnShape, capacity: int, provider: str = "cpu") -> None:
        ort = _ort()
        if ort is None:
            raise RuntimeError("onnxruntime is not installed")
        self.sh, self.capacity = sh, capacity
        so = ort.SessionOptions()
        so.log_severity_level = 4  # failures are reported as reasons
        if provider == "webgpu":
            devices, why = webgpu_devices()
            if not devices:
                raise RuntimeError(why)
            so.add_provider_for_devices(devices, {})
            self.session = ort.InferenceSession(verify_model(sh, capacity), so)
        else:
            self.session = ort.InferenceSession(verify_model(sh, capacity), so,
                                                providers=["CPUExecutionProvider"])

    def run(self, state: np.ndarray, d: Draft, n: int, b: SpecBytes) -> tuple[np.ndarray, np.ndarray]:
        """(final state [Hv, Dv, Dk], capsule [C * row]) after feeding draft tokens 0..n-1."""
        feeds = {"query": d.q[:n], "key": d.k[:n], "value": d.v[:n], "decay": d.g[:n],
                 "beta": d.beta[:n], "initial_state": state[None],
                 "capture_count": np.array([n], np.int32)}
        _, final, capsule = self.session.run(["output", "final_state", "state_update"], feeds)
        sh = self.sh
        b.state_read += state.nbytes
        b.inputs_read += n * sh.token_input_bytes
        b.state_written += final.nbytes
        b.capsule_written += capsule.nbytes
        b.h2d += CAPTURE_COUNT_BYTES
        return final[0], capsule[0]


_webgpu: dict[str, object] = {}


def webgpu_devices() -> tuple[list, str]:
    """ORT's WebGPU plugin EP devices (registered once, by `backends.ort`), or why none."""
    if "result" not in _webgpu:
        try:
            from backends.ort import PROVIDERS
            _webgpu["result"] = PROVIDERS["webgpu"].devices()
        except Exception as exc:  # noqa: BLE001 - any failure is a reason, not a crash
            _webgpu["result"] = ([], f"WebGPU EP probe failed: {type(exc).__name__}: {exc}")
    return _webgpu["result"]  # type: ignore[return-value]


class WebGpuReplay:
    """GatedDeltaNetStateReplay on ORT's WebGPU EP: source and capsule are read-only device
    backings; the destination is one device value bound as both `destination_backing` and the
    prebound `destination_out` (the op's contract); metadata stays on the CPU."""

    def __init__(self, sh: GdnShape, capacity: int) -> None:
        ort = _ort()
        devices, why = webgpu_devices()
        if not devices:
            raise RuntimeError(why)
        so = ort.SessionOptions()
        so.log_severity_level = 4  # failures are reported as reasons
        so.add_provider_for_devices(devices, {})
        self.ort, self.sh, self.capacity = ort, sh, capacity
        try:
            self.session = ort.InferenceSession(replay_model(), so)
        except Exception as exc:
            if "Provider type for GatedDeltaNetStateReplay" in str(exc):
                # seen with onnxruntime-ep-webgpu 0.4.0: the plugin has no kernel for the op
                raise RuntimeError(
                    "no execution provider here implements GatedDeltaNetStateReplay (the WebGPU "
                    f"plugin EP {package_version('onnxruntime-ep-webgpu') or '(not installed)'} "
                    "has no kernel for it)") from None
            raise

    def run(self, source: np.ndarray, capsule: np.ndarray, kept: int, b: SpecBytes) -> np.ndarray:
        ort, sh = self.ort, self.sh
        # the uploads stand in for buffers a device-resident pipeline already has: not counted
        src = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(source.ravel()), "webgpu", 0)
        cap = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(capsule), "webgpu", 0)
        dst = ort.OrtValue.ortvalue_from_numpy(np.zeros(source.size, np.float32), "webgpu", 0)
        io = self.session.io_binding()
        io.bind_ortvalue_input("source_backing", src)
        io.bind_ortvalue_input("capsule_backing", cap)
        io.bind_ortvalue_input("destination_backing", dst)
        io.bind_cpu_input("metadata", replay_metadata(sh, self.capacity, kept))
        io.bind_ortvalue_output("destination_out", dst)
        self.session.run_with_iobinding(io)
        b.state_read += source.nbytes
        b.capsule_read += kept * sh.capsule_row_floats * F32
        b.state_written += source.nbytes
        b.h2d += REPLAY_METADATA_BYTES
        return dst.numpy().reshape(source.shape)
