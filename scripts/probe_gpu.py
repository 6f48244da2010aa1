"""Probe a GPU box once: wgpu adapter limits/features and the ORT WebGPU EP's device-value API."""
import json, sys, time, traceback
import numpy as np

out = {}
try:
    import wgpu
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    out["adapter"] = a.summary
    out["features"] = sorted(a.features)
    out["limits"] = {k: v for k, v in a.limits.items() if "buffer" in k.lower() or "workgroup" in k.lower() or "invocations" in k.lower()}
    out["info"] = dict(a.info)
except Exception:
    out["wgpu_error"] = traceback.format_exc()
try:
    import onnxruntime as ort, onnxruntime_ep_webgpu as epw
    ort.register_execution_provider_library("WebGPU", epw.get_library_path())
    devs = ort.get_ep_devices()
    out["ep_devices"] = [(d.ep_name, str(d.device.type), d.device.vendor, dict(d.device.metadata)) for d in devs]
    import onnx
    from onnx import helper, TensorProto
    n = 1024
    W = np.random.rand(n, n).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Add", ["y", "x"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])], [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor("W", TensorProto.FLOAT, [n, n], W.ravel())])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]); m.ir_version = 10
    so = ort.SessionOptions()
    web = [d for d in devs if d.ep_name == "WebGpuExecutionProvider"]
    so.add_provider_for_devices(web, {})
    s = ort.InferenceSession(m.SerializeToString(), so)
    out["providers"] = s.get_providers()
    x = np.random.rand(1, n).astype(np.float32)
    res = {}
    for dev in ["webgpu", "WebGPU_Buffer", "gpu"]:
        try:
            v = ort.OrtValue.ortvalue_from_numpy(x, dev, 0); res[dev] = ("ok", v.device_name())
        except Exception as e:
            res[dev] = str(e)[:200]
    out["ortvalue_devices"] = res
    try:
        mi = s.get_outputs()
        io = s.io_binding()
        io.bind_cpu_input("x", x)
        for dev in ["webgpu", "WebGPU_Buffer"]:
            try:
                io.bind_output("z", dev); s.run_with_iobinding(io); outs = io.get_outputs(); out["bind_output_"+dev] = outs[0].device_name()
                z = outs[0].numpy(); out["bind_ok_"+dev] = float(np.abs(z - (x @ W + x)).max())
                break
            except Exception as e:
                out["bind_output_"+dev] = str(e)[:300]
    except Exception:
        out["io_error"] = traceback.format_exc()[-800:]
    try:
        mems = [str(mi) for mi in s.get_memory_info_for_inputs()] if hasattr(s, "get_memory_info_for_inputs") else None
        out["mem_info_inputs"] = mems
    except Exception as e:
        out["mem_info_inputs"] = str(e)[:200]
    out["ort_dir"] = [k for k in dir(ort) if "ortvalue" in k.lower() or "Memory" in k or "alloc" in k.lower()]
    out["ortvalue_methods"] = [k for k in dir(ort.OrtValue) if not k.startswith("__")]
    out["session_methods"] = [k for k in dir(s) if not k.startswith("__")]
except Exception:
    out["ort_error"] = traceback.format_exc()[-2000:]
print(json.dumps(out, indent=1, default=str))
