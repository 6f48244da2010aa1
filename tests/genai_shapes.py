"""The committed genai q4f16 export (tests/models/genai-q4f16-llama) with its MLP widened to a
multiple of the 4-bit block: the full-size export's path on the tiny model's graph.

Why: the committed model's MLP is 176 wide, which is not a multiple of its 32-wide blocks, so
its down projection reads a zero-padded input (MatMulNBits' last block) and its SwiGLU runs
as a launch of its own; Llama-3.2-1B's 8192 has no padding. Same nodes, same attributes but
K and N, fresh random codes and scales (seeded), so the same converter and kernels run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

GENAI_Q4F16 = Path(__file__).resolve().parent / "models" / "genai-q4f16-llama" / "model.onnx"


def widened_mlp(ffn: int = 192, seed: int = 0, path: Path = GENAI_Q4F16) -> onnx.ModelProto:
    """The export with every MLP projection's inner width ``ffn`` (a multiple of 32)."""
    assert ffn % 32 == 0
    model = onnx.load(str(path))
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or "/mlp/" not in node.name:
            continue
        attrs = {a.name: a for a in node.attribute}
        block = attrs["block_size"].i
        down = "down_proj" in node.name
        if down:
            attrs["K"].i = ffn
        else:
            attrs["N"].i = ffn
        k, n = attrs["K"].i, attrs["N"].i
        blocks = k // block
        codes = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
        old = numpy_helper.to_array(inits[node.input[2]])
        scales = (rng.uniform(0.5, 1.5, (n, blocks)) * np.abs(old).mean()).astype(old.dtype)
        for name, arr in ((node.input[1], codes), (node.input[2], scales)):
            inits[name].CopyFrom(numpy_helper.from_array(arr, name))
    del model.graph.value_info[:]  # the exporter's shapes of the old width
    return model
