"""The model layer: the decoder workload (presets, weights, token stream), its float64
reference, its ONNX export, and the user-error type. Backends use it; it uses no backend."""
