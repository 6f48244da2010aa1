"""A sweep of a model statebench did not write (`statebench run --model`): what the results
record of it, how far its positions reach, its reference, and which backends can run it.

The reference is ONNX Runtime's CPU EP on the same graph, its cache growing as the model
gives it (`ort-cpu:copy`): there is no float64 NumPy decoder of a graph statebench does not
know. One hint of the graph is set aside: a `MatMulNBits` whose `accuracy_level` lets ORT
compute in lower precision (2 float16, 3 bfloat16, 4 int8 activations: the default of
onnxruntime-genai's int4 exports, whose int8 activations put the CPU EP's logits percents
off the dequantised weights' product) runs at level 1, float32 products, in the
reference's copy of the graph (``reference_graph``). It walks a random token prefix of the
seed up to each context; the state it holds there is the depth every backend starts from (a
page writes it, a hidden cache is reached by dispatching the prefix), and its logits for the
warm-up and timed steps are what every backend's logits are compared with, within the
float32 tolerance, or the float16 one where the graph's logits are float16
(``UserModel.tolerance``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from backends.base import Backend
from backends.webnn.dims import default_dims
from backends.webnn.onnx_converter import CachePair, ConversionError, list_kv_pairs
from harness.metrics import FLOAT32_TOLERANCE, float16_tolerance
from harness.model_info import load_model, model_file, pair_record, token_input_refusal
from model.errors import UserError

#: what the results record as the reference of a model sweep
REFERENCE = "ort-cpu (float32 products, growing cache)"
#: ``MatMulNBits`` accuracy levels above float32 products (2 float16, 3 bfloat16, 4 int8)
LOW_PRECISION_LEVELS = (2, 3, 4)
#: the backend the reference is (`backends.ort`)
REFERENCE_BACKEND = "ort-cpu:copy"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _external_files(proto: onnx.ModelProto, path: Path) -> list[Path]:
    """The external data files the graph's initializers name, beside ``path``."""
    names: dict[str, None] = {}
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            for e in t.external_data:
                if e.key == "location":
                    names.setdefault(e.value, None)
    return [path.parent / n for n in names]


def position_limit(proto: onnx.ModelProto, path: Path) -> tuple[int | None, str]:
    """The positions the model can reach, and what says so (None, "" when nothing does):
    the rows of a cos/sin cache (GroupQueryAttention, RotaryEmbedding), of a table gathered
    by position_ids, or genai_config.json's context_length."""
    inits = {t.name: list(t.dims) for t in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output}

    def from_positions(name: str) -> bool:
        """Whether ``name`` is position_ids, or taken from it by ops that keep its values
        (a section of Qwen's [3, B, S] positions, a cast, a reshape)."""
        for _ in range(8):
            if name == "position_ids":
                return True
            node = producers.get(name)
            if node is None or node.op_type not in ("Gather", "Cast", "Reshape", "Squeeze",
                                                    "Unsqueeze", "Identity"):
                return False
            name = node.input[0]
        return False

    limits: list[tuple[int, str]] = []
    for n in proto.graph.node:
        caches = {"GroupQueryAttention": (7, 8), "RotaryEmbedding": (2, 3)}.get(n.op_type, ())
        for j in caches:
            if j < len(n.input) and n.input[j] in inits and inits[n.input[j]]:
                limits.append((inits[n.input[j]][0], f"{n.input[j]} of {n.op_type} "
                               f"{n.name or n.output[0]!r} has {inits[n.input[j]][0]} rows"))
        if n.op_type == "Gather" and len(n.input) == 2 and n.input[0] in inits and \
                from_positions(n.input[1]) and inits[n.input[0]]:
            limits.append((inits[n.input[0]][0], f"the position table {n.input[0]} gathered by "
                           f"position_ids has {inits[n.input[0]][0]} rows"))
    config = path.parent / "genai_config.json"
    if config.is_file():
        try:
            length = json.loads(config.read_text())["model"]["context_length"]
            limits.append((int(length), f"genai_config.json's context_length is {length}"))
        except (ValueError, KeyError, TypeError):
            pass
    return min(limits) if limits else (None, "")


@dataclass
class UserModel:
    """A model file and what a sweep needs of it before anything runs."""

    path: Path
    proto: onnx.ModelProto
    pairs: list[CachePair]
    hand_pairs: dict[str, str] = field(default_factory=dict)
    files: list[Path] = field(default_factory=list)

    @classmethod
    def load(cls, model: str | os.PathLike, hand_pairs: dict[str, str] | None = None) -> UserModel:
        """A bad path or file, or a hand-named pair naming no input or output, is a
        ``UserError`` (one line, exit 2)."""
        path = model_file(model)
        proto = load_model(path)
        try:
            pairs = list_kv_pairs(proto, hand_pairs)
        except ConversionError as exc:
            raise UserError(f"{path}: {exc}") from None
        if not pairs:
            raise UserError(f"{path}: no cache pairs found; name them with --pairs INPUT=OUTPUT")
        why = token_input_refusal(proto)
        if why:
            raise UserError(f"{path}: {why}")
        files = [path, *_external_files(proto, path)]
        missing = [f for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{path}: its external data file {missing[0].name} is missing")
        return cls(path.resolve(), proto, pairs, dict(hand_pairs or {}), files)

    @property
    def size(self) -> int:
        """Bytes of the model file and its external data."""
        return sum(f.stat().st_size for f in self.files)

    @property
    def name(self) -> str:
        """A file-name-safe name: the folder's for a folder's model.onnx, else the file's."""
        stem = self.path.parent.name if self.path.stem in ("model", "decode") else self.path.stem
        return re.sub(r"[^A-Za-z0-9._-]+", "_", stem) or "model"

    @property
    def tolerance(self) -> float:
        """The logits tolerance: float16's for a graph whose logits (every output that is not
        a pair's present) are float16, by its layer count (the distinct layer numbers of
        its pairs' names, else half its pairs), else float32's (``metrics``)."""
        presents = {p.output for p in self.pairs}
        outs = [o for o in self.proto.graph.output if o.name not in presents]
        if not outs or any(o.type.tensor_type.elem_type != onnx.TensorProto.FLOAT16
                           for o in outs):
            return FLOAT32_TOLERANCE
        numbers = {m.group(1) for p in self.pairs if (m := re.search(r"\.(\d+)\.", p.input))}
        return float16_tolerance(len(numbers) or -(-len(self.pairs) // 2))

    @property
    def low_precision_products(self) -> list[str]:
        """The ``MatMulNBits`` nodes whose ``accuracy_level`` allows lower-precision products."""
        return [n.name or n.output[0] for n in self.proto.graph.node
                if _low_precision_level(n) is not None]

    @property
    def takes_token_chunks(self) -> bool:
        """Whether one run can feed several tokens: input_ids' token dim is not a fixed 1
        and every pair is an append of the new-token dim's rows (genai's and optimum's
        graphs, transformers' with ``multi_token_decode``), so a prompt chunk grows each
        cache by its count. A pair that is overwritten (a recurrent state, a conv window)
        or grows by a fixed row count says no: the reference then walks one token a run."""
        return self.may_take_token_chunks and all(p.kind == "append" for p in self.pairs)

    @property
    def may_take_token_chunks(self) -> bool:
        """Whether a run may feed several tokens where some pairs are overwritten (a
        hybrid's recurrent state and conv window, which genai's graphs compute for a prompt
        chunk as for one token): input_ids' token dim is not a fixed 1 and every pair
        appends the new-token dim's rows or is overwritten. Only a probe says whether the
        overwritten ones come out right (``harness.sources.OrtReferenceWalk``)."""
        ids = next((i for i in self.proto.graph.input if i.name == "input_ids"), None)
        if ids is None or len(ids.type.tensor_type.shape.dim) != 2:
            return False
        dim = ids.type.tensor_type.shape.dim[1]
        fixed = dim.HasField("dim_value") or dim.dim_param.strip().isdigit()
        return not fixed and all(p.kind == "overwrite" or (p.kind == "append"
                                                          and isinstance(p.new, str))
                                 for p in self.pairs)

    def check_positions(self, last: int) -> None:
        """Refuse, in one line, a sweep whose last position (0-based) the model cannot reach."""
        limit, why = position_limit(self.proto, self.path)
        if limit is not None and last >= limit:
            raise UserError(f"{self.path}: the sweep reaches position {last} but the model has "
                            f"{limit} positions ({why}); use smaller --contexts or --steps")

    def describe(self, capacity: int) -> dict:
        """The results' workload.model: path, size, sha256 (of each file), its pairs as
        `statebench inspect` lists them, and the dims pinned at ``capacity``."""
        return {
            "path": str(self.path), "size": self.size, "sha256": sha256(self.path),
            "external_data": [{"file": f.name, "size": f.stat().st_size, "sha256": sha256(f)}
                              for f in self.files[1:]],
            "pairs": [pair_record(p) for p in self.pairs],
            "hand_pairs": self.hand_pairs,
            "dims": {k: {"value": d.value, "how": d.how}
                     for k, d in default_dims(self.proto, capacity, self.pairs).items()},
            "reference": REFERENCE,
            "reference_graph": reference_changes(self),
            "tolerance": self.tolerance,
        }

    def refusal(self, cls: type[Backend]) -> str:
        """Why backend ``cls`` cannot run this model ("" where it may), before any worker: one
        that runs presets only, or its own ``model_refusal`` (an ORT mode that needs
        statebench's own graph, or a graph ORT cannot share a buffer in). The WebNN pages
        rewrite growing caches (``backends.webnn.fixed_capacity``) and say in prepare what
        they cannot run; a backend whose prepare fails on the model is unavailable with its
        reason (``harness.worker``)."""
        if not cls.runs_models:
            return f"{cls.name} runs statebench's presets only"
        return cls.model_refusal(self.proto, self.hand_pairs)


@dataclass(frozen=True)
class ModelFile:
    """A model file as a backend is built for it (``backends.base.BuildSource``)."""

    model_path: Path
    hand_pairs: dict[str, str] = field(default_factory=dict)


def backend_for(cls: type[Backend], path: str | os.PathLike, pairs: dict[str, str] | None,
                options: object | None = None) -> Backend:
    """An instance of ``cls`` on the model at ``path`` (``Backend.create``), with ``options``
    (``Backend.options_type``) where given."""
    return cls.create(ModelFile(Path(path), dict(pairs or {})), options)


def _low_precision_level(node: onnx.NodeProto) -> onnx.AttributeProto | None:
    """A ``MatMulNBits`` node's ``accuracy_level`` where it allows lower-precision products."""
    if node.op_type != "MatMulNBits":
        return None
    return next((a for a in node.attribute
                 if a.name == "accuracy_level" and a.i in LOW_PRECISION_LEVELS), None)


def reference_changes(model: UserModel) -> str:
    """What the reference's copy of the graph changes, in words ("" for nothing)."""
    low = model.low_precision_products
    return (f"MatMulNBits accuracy_level 1 (float32 products) in place of the graph's lower "
            f"precision on {len(low)} nodes" if low else "")


def reference_graph(model: UserModel, folder: Path) -> Path:
    """The graph the reference runs: ``model.path`` itself, or where its ``MatMulNBits``
    may compute in lower precision, a copy in ``folder`` with those at accuracy_level 1
    beside its external data files, hard-linked (copied where a link cannot be made: another
    file system). Not symbolic links: ORT refuses external data whose resolved path leaves
    the model's folder."""
    if not model.low_precision_products:
        return model.path
    proto = onnx.ModelProto()
    proto.CopyFrom(model.proto)
    for n in proto.graph.node:
        if (level := _low_precision_level(n)) is not None:
            level.i = 1
    for f in model.files[1:]:
        dst = folder / f.relative_to(model.path.parent)
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(f, dst)
        except OSError:
            shutil.copyfile(f, dst)
    out = folder / model.path.name
    onnx.save(proto, str(out))
    return out
