"""A decode graph that also gives its next tokens: ``argMax`` of each logits row, on the
device, as a page doing greedy decoding (or a greedy verify) would build it, so the page
reads K int64 ids back instead of K rows of logits (llama-1b: 8 bytes against 0.5 MB a
row). The logits stay an output, unread.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

#: the output the ids are written to: int64 [batch, K], the argmax of each logits row
NEXT_IDS = "next_ids"


def with_next_ids(proto: onnx.ModelProto, logits: str) -> onnx.ModelProto:
    """``proto`` (a copy) with ``NEXT_IDS = ArgMax(logits, axis=-1, keepdims=0)`` as one more
    output. ValueError where ``logits`` is not an output of rank 2 or more, or the graph
    already has an output of that name."""
    out = next((o for o in proto.graph.output if o.name == logits), None)
    dims = out.type.tensor_type.shape.dim if out is not None else []
    if out is None or len(dims) < 2:
        raise ValueError(f"the graph has no output {logits!r} of rank 2 or more to take the "
                         "argmax of")
    if any(o.name == NEXT_IDS for o in proto.graph.output):
        raise ValueError(f"the graph already has an output named {NEXT_IDS!r}")
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    model.graph.node.append(helper.make_node("ArgMax", [logits], [NEXT_IDS], axis=-1,
                                             keepdims=0, name="statebench_next_ids"))
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
             for d in dims[:-1]]
    model.graph.output.append(helper.make_tensor_value_info(NEXT_IDS, TensorProto.INT64, shape))
    return model
