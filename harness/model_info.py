"""What `statebench inspect` says about a model statebench did not write: its interface,
the cache pairs its names give, the dims pinned for a decode step, and per backend family
whether it runs there or the first thing that stops it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from backends.webnn.dims import default_dims
from backends.webnn.onnx_converter import ConversionError, convert, list_kv_pairs
from model.errors import UserError

#: the files a model folder may hold, in the order looked for (genai and optimum write
#: model.onnx, transformers' OnnxExporter decode.onnx)
FOLDER_FILES = ("model.onnx", "decode.onnx")


def model_file(model: str | os.PathLike) -> Path:
    """The .onnx file ``model`` names: itself, or the one a folder holds."""
    p = Path(model)
    if p.is_dir():
        for name in FOLDER_FILES:
            if (p / name).is_file():
                return p / name
        raise UserError(f"{p}: a folder with no {' or '.join(FOLDER_FILES)}")
    if not p.is_file():
        raise UserError(f"{p}: no such file or folder")
    return p


def load_model(path: Path) -> onnx.ModelProto:
    """The graph at ``path`` (weights left out); a file that is not one is a ``UserError``."""
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise UserError(f"{path}: not an ONNX model ({' '.join(str(exc).split())[:200]})") from None
    if not proto.graph.node and not proto.graph.input and not proto.graph.output:
        raise UserError(f"{path}: not an ONNX model (no graph)")
    return proto


def token_input_refusal(proto: onnx.ModelProto) -> str:
    """Why statebench cannot feed the graph its tokens ("" otherwise): every backend and the
    reference feed token ids, so a decoder that takes ``inputs_embeds`` instead (an export
    without its embedding) runs nowhere."""
    inits = {t.name for t in proto.graph.initializer}
    names = {i.name for i in proto.graph.input if i.name not in inits}
    if "inputs_embeds" in names and "input_ids" not in names:
        return ("the graph takes inputs_embeds, not input_ids (an export without its "
                "embedding, e.g. the genai builder's exclude_embeds=true): statebench feeds "
                "token ids; export the model with its embedding")
    return ""


def _value(vi: onnx.ValueInfoProto) -> dict:
    tt = vi.type.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
             for d in tt.shape.dim] if tt.HasField("shape") else None
    return {"name": vi.name, "type": onnx.TensorProto.DataType.Name(tt.elem_type).lower(),
            "shape": shape}


@dataclass
class _WebNN:
    """A WebNN context for the checks, or why there is none."""

    context: object = None
    why_not: str = ""

    @classmethod
    def open(cls) -> _WebNN:
        try:
            from backends.webnn import ml

            return cls(ml.create_context(state_support=True))
        except Exception as exc:  # noqa: BLE001 - no adapter is an answer, not a crash
            return cls(None, f"no WebGPU adapter: {' '.join(str(exc).split())}")

    def convert(self, model: onnx.ModelProto, base: Path, pairs=None) -> str:
        """"" when ``convert`` builds the (pinned) graph, else its first error in one line."""
        if self.context is None:
            return self.why_not
        try:
            convert(model, self.context, use_stateful=pairs is not None, kv_cache_pairs=pairs,
                    base=base)
        except ConversionError as exc:
            return " ".join(str(exc).split())
        except Exception as exc:  # noqa: BLE001 - the first thing that stops it, named
            return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        return ""


def pair_record(p) -> dict:
    """A pair as `inspect` and the results list it: names, kind, axis, the rows it gains a
    step (``new``: a number or the new-token dim's symbol, K) and the rule that matched."""
    return {"input": p.input, "output": p.output, "kind": p.kind, "axis": p.axis,
            "new": p.new, "how": p.how}


def _verdict(why_not: str) -> dict:
    return {"runs": not why_not, "why_not": why_not}


def inspect_model(model: str | os.PathLike, capacity: int = 256,
                  pairs: Mapping[str, str] | None = None, backends: bool = True) -> dict:
    """The report `statebench inspect` prints (JSON-ready). A file that is not a readable
    ONNX model, or a hand-named pair naming no input or output, is a ``UserError``."""
    path = model_file(model)
    proto = load_model(path)
    inits = {t.name for t in proto.graph.initializer}
    try:  # a growing cache's own axis is its past, whatever its symbol is called
        grown = list_kv_pairs(proto, pairs)
    except ConversionError:
        grown = []
    dims = default_dims(proto, capacity, grown)
    report: dict = {
        "model": str(path),
        "inputs": [_value(v) for v in proto.graph.input if v.name not in inits],
        "outputs": [_value(v) for v in proto.graph.output],
        "capacity": capacity,
        "dims": {k: {"value": d.value, "how": d.how} for k, d in dims.items()},
    }
    try:
        found = list_kv_pairs(proto, pairs)
        pairs_error = ""
    except ConversionError as exc:
        if str(exc).startswith("--pairs"):
            raise UserError(str(exc)) from None
        found, pairs_error = [], str(exc)
    report["pairs"] = [pair_record(p) for p in found]
    report["naming_rules"] = list(dict.fromkeys(p.rule for p in found))
    report["pairs_error"] = pairs_error
    if backends:
        report["backends"] = check_backends(path, found, pairs_error, capacity, pairs)
    return report


def check_backends(path: Path, pairs: list, pairs_error: str, capacity: int = 256,
                   hand: Mapping[str, str] | None = None) -> dict:
    """Per family: WebNN without state, WebNN stateful (the proposal: same-shape pairs), the
    ORT CPU EP loading the graph. The WebNN families take the model as the pages do: its
    growing caches made fixed-capacity first (``backends.webnn.fixed_capacity``)."""
    from backends.ort import cpu_session_error
    from backends.webnn.fixed_capacity import FixedCapacityError, fixed_model

    webnn = _WebNN.open()
    fixed = load_model(path)
    try:
        fixed_model(fixed, capacity, hand)
        why = ""
    except (ConversionError, FixedCapacityError) as exc:
        why = " ".join(str(exc).split())
    plain = why or webnn.convert(fixed, path.parent)
    if pairs_error:
        stateful = pairs_error
    elif not pairs:
        stateful = "no cache pairs found (name them with --pairs INPUT=OUTPUT)"
    else:
        stateful = plain or why or webnn.convert(fixed, path.parent, list_kv_pairs(fixed, hand))
    if webnn.context is not None:
        webnn.context.destroy()
    tokens = token_input_refusal(fixed)  # what no backend can feed stops every family first
    return {"webnn": _verdict(tokens or plain), "webnn-stateful": _verdict(tokens or stateful),
            "ort-cpu": _verdict(tokens or cpu_session_error(path))}
