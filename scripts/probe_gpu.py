"""Probe a GPU box once: the wgpu adapter (features, limits) and ONNX Runtime's WebGPU plugin EP
(devices, device-resident OrtValues, IOBinding to the device). Prints JSON; used to learn the
H200 machine before writing the `ort-webgpu:*` backends (record: 4f0f55b:results/h200/probe.json)."""

import json
import traceback

import numpy as np


def probe_wgpu() -> dict:
    import wgpu

    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    keys = ("buffer", "workgroup", "invocations")
    return {"adapter": a.summary, "features": sorted(a.features), "info": dict(a.info),
            "limits": {k: v for k, v in a.limits.items() if any(w in k.lower() for w in keys)}}


def probe_ort() -> dict:
    import onnxruntime as ort
    import onnxruntime_ep_webgpu as epw
    from onnx import TensorProto, helper

    ort.register_execution_provider_library("WebGPU", epw.get_library_path())
    devs = ort.get_ep_devices()
    out: dict = {"ep_devices": [(d.ep_name, str(d.device.type), d.device.vendor,
                                 dict(d.device.metadata)) for d in devs]}
    n = 1024
    w = np.random.rand(n, n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor("W", TensorProto.FLOAT, [n, n], w.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.add_provider_for_devices([d for d in devs if d.ep_name == "WebGpuExecutionProvider"], {})
    sess = ort.InferenceSession(model.SerializeToString(), so)
    out["providers"] = sess.get_providers()
    x = np.random.rand(1, n).astype(np.float32)
    values = {}
    for dev in ("webgpu", "gpu"):
        try:
            values[dev] = ort.OrtValue.ortvalue_from_numpy(x, dev, 0).device_name()
        except Exception as exc:  # noqa: BLE001 - a probe records every failure
            values[dev] = str(exc)[:200]
    out["ortvalue_devices"] = values
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("z", "webgpu")
    sess.run_with_iobinding(io)
    z = io.get_outputs()[0]
    out["bind_output_webgpu"] = z.device_name()
    out["bind_max_abs_err"] = float(np.abs(z.numpy() - (x @ w + x)).max())
    out["session_methods"] = [k for k in dir(sess) if not k.startswith("_")]
    return out


def main() -> None:
    out = {}
    for name, fn in (("wgpu", probe_wgpu), ("ort", probe_ort)):
        try:
            out[name] = fn()
        except Exception:  # noqa: BLE001
            out[name] = {"error": traceback.format_exc()[-2000:]}
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
