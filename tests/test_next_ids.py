"""``backends.next_ids``: a decode graph with its next tokens as one more output, checked by
ONNX's own reference evaluator against NumPy's argmax."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from backends.next_ids import NEXT_IDS, with_next_ids


def _graph(out_name: str = "logits", rank: int = 3) -> onnx.ModelProto:
    shape = [1, "k", 7][-rank:]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info(out_name, TensorProto.FLOAT, shape)
    g = helper.make_graph([helper.make_node("Neg", ["x"], [out_name])], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_next_ids_are_each_rows_argmax():
    model = with_next_ids(_graph(), "logits")
    onnx.checker.check_model(model)
    x = np.random.default_rng(3).standard_normal((1, 4, 7)).astype(np.float32)
    logits, ids = ReferenceEvaluator(model).run(None, {"x": x})
    assert ids.dtype == np.int64 and ids.shape == (1, 4)
    np.testing.assert_array_equal(ids, np.argmax(-x, -1))
    assert [o.name for o in model.graph.output] == ["logits", NEXT_IDS]
    assert len(_graph().graph.output) == 1  # the proto given is left as it was


@pytest.mark.parametrize("model,why", [(_graph("scores"), "no output 'logits'"),
                                       (_graph(rank=1), "rank 2"),
                                       (with_next_ids(_graph(), "logits"), "already has")])
def test_refusals(model, why):
    with pytest.raises(ValueError, match=why):
        with_next_ids(model, "logits")
