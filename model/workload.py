"""The decode workload of DESIGN §5: model shapes, presets, deterministic weights, token stream.

This module is the one place the model's *shapes and parameters* are defined. Its math lives in
`model.reference` (float64 NumPy); its graphs in `model.export` (two ONNX flavours).
Everything is derived from a `ModelConfig` and a seed, so every backend and oracle sees the same
weights and the same teacher-forced tokens without any download.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from model import checksum
from model.atomic import atomic_file
from model.errors import UserError
from model.quantize import Q4_BLOCK, round_trip

ATTENTION = "attention"
GDN = "gdn"
LAYER_KINDS = (ATTENTION, GDN)
#: ModelConfig.weights' accepted values
WEIGHT_FORMATS = ("float32", "float16", "q4")
#: ModelConfig.dtype's accepted values (the activations' data type)
ACTIVATION_TYPES = ("float32", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of one decoder. Matrices are stored (in, out) so a step is `x @ W`."""

    name: str
    layers: tuple[str, ...]
    hidden: int
    ffn: int
    vocab: int
    # attention layers: grouped-query heads with RoPE (rotate-half, as Llama)
    q_heads: int
    kv_heads: int
    head_dim: int
    # gated delta net layers: q/k heads share, v heads a multiple (ORT GatedDeltaNet's layout)
    gdn_qk_heads: int = 0
    gdn_v_heads: int = 0
    gdn_qk_dim: int = 0
    gdn_v_dim: int = 0
    #: taps of the causal depthwise conv over the concatenated q/k/v projections of a GDN
    #: layer (SiLU after it), as Qwen3.5; its window of the last taps-1 columns is a state
    #: of its own (``cache_specs``). 0: no conv (configs made before it existed)
    gdn_conv_kernel: int = 0
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5
    tied_embeddings: bool = True
    #: the activations' data type. "float16" (a preset name with Q4F16_SUFFIX): every
    #: activation between ops is float16 (so are the KV caches), the weights that stay
    #: unquantised (embedding, norms) are float16 values; the reference still computes in
    #: float64 on those exact values, and the logits are compared under the float16
    #: tolerance (harness.metrics.logits_tolerance)
    dtype: str = "float32"
    #: "float16": every weight is a float16 value (stored as float32 everywhere), so an
    #: implementation may keep the weights as float16 without loss: the floor counts 2 bytes
    #: a parameter (a preset name with WEIGHTS_F16_SUFFIX). "q4": every matrix weight
    #: (``quantised_names``) is a 4-bit block-quantised matrix (model.quantize; a preset
    #: name with Q4_SUFFIX), stored dequantised (float32, exact) so the reference uses it as
    #: is; the embedding stays float32 and the LM head becomes a tensor of its own
    weights: str = "float32"
    #: the KV caches' data type, a property of the model (a preset name with
    #: KV_F16_SUFFIX): "float16" caches are float16 graph inputs and outputs, their new
    #: rows rounded to float16 as they are written; compute stays float32 (``dtype``).
    #: Recurrent (GDN) states stay float32.
    kv_cache: str = "float32"

    def __post_init__(self) -> None:
        if self.weights not in WEIGHT_FORMATS:
            raise UserError(f"weights {self.weights!r}; accepted: {', '.join(WEIGHT_FORMATS)}")
        if self.dtype not in ACTIVATION_TYPES:
            raise UserError(f"dtype {self.dtype!r}; accepted: {', '.join(ACTIVATION_TYPES)}")
        if self.kv_cache not in ("float32", "float16"):
            raise UserError(f"kv_cache {self.kv_cache!r}; accepted: float32, float16")
        bad = [k for k in self.layers if k not in LAYER_KINDS]
        if bad:
            raise UserError(f"unknown layer kind {bad[0]!r}; accepted: {', '.join(LAYER_KINDS)}")
        if self.q_heads % self.kv_heads:
            raise UserError("q_heads must be a multiple of kv_heads")
        if GDN in self.layers and (self.gdn_v_heads % self.gdn_qk_heads):
            raise UserError("gdn_v_heads must be a multiple of gdn_qk_heads")
        if self.gdn_conv_kernel == 1 or self.gdn_conv_kernel < 0:
            raise UserError("gdn_conv_kernel must be 0 (no conv) or at least 2")

    @property
    def attention_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layers) if k == ATTENTION]

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layers) if k == GDN]

    @property
    def gdn_conv_dim(self) -> int:
        """Channels of a GDN layer's conv: q, k and v concatenated (Qwen3.5's conv_dim)."""
        return 2 * self.gdn_qk_heads * self.gdn_qk_dim + self.gdn_v_heads * self.gdn_v_dim

    @property
    def weight_bytes_per_parameter(self) -> int:
        """Bytes of an unquantised parameter (``weights_bytes`` counts quantised ones)."""
        return 2 if "float16" in (self.weights, self.dtype) else 4

    @property
    def separate_head(self) -> bool:
        """Whether the LM head is a tensor of its own (``lm_head``): untied, or the
        4-bit head of a tied model whose embedding stays float."""
        return not self.tied_embeddings or self.weights == "q4"

    @property
    def kv_bytes_per_element(self) -> int:
        return 2 if self.kv_cache == "float16" else 4

    def describe(self) -> dict:
        """Plain data for the results file's `workload` section."""
        d = asdict(self)
        d["layers"] = list(self.layers)
        d["parameters"] = int(sum(int(np.prod(s)) for s in weight_shapes(self).values()))
        if self.weights == "q4":
            d["quantised"] = {"format": f"int4, symmetric, block {Q4_BLOCK} along the input "
                                        "dimension, a float16-valued scale a block",
                              "tensors": quantised_names(self)}
        d["activations"] = self.dtype
        return d


def _pattern(n: int, every: int) -> tuple[str, ...]:
    """`every`-1 GDN layers then one attention layer, repeated (Qwen3-Next's 3:1 for every=4)."""
    return tuple(ATTENTION if (i + 1) % every == 0 else GDN for i in range(n))


PRESETS: dict[str, ModelConfig] = {
    # tests: one layer of each kind, hidden 64
    "tiny": ModelConfig(
        name="tiny", layers=(GDN, ATTENTION), hidden=64, ffn=128, vocab=256,
        q_heads=4, kv_heads=2, head_dim=16,
        gdn_qk_heads=2, gdn_v_heads=4, gdn_qk_dim=16, gdn_v_dim=16, gdn_conv_kernel=4,
    ),
    # the default CPU sweep: hybrid 3 GDN : 1 attention
    "small": ModelConfig(
        name="small", layers=_pattern(4, 4), hidden=256, ffn=768, vocab=4096,
        q_heads=8, kv_heads=2, head_dim=32,
        gdn_qk_heads=4, gdn_v_heads=8, gdn_qk_dim=32, gdn_v_dim=32, gdn_conv_kernel=4,
    ),
    # Llama-3.2-1B's published shapes (attention only, tied embeddings)
    "llama-1b": ModelConfig(
        name="llama-1b", layers=(ATTENTION,) * 16, hidden=2048, ffn=8192, vocab=128256,
        q_heads=32, kv_heads=8, head_dim=64, rope_theta=500000.0,
    ),
    # Qwen3-Next-style head shapes (GDN 16 qk heads x 128, 32 v heads x 128, a 4-tap conv;
    # attention 16 q / 2 kv heads x 256), 3 GDN : 1 attention, scaled to ~1.2B parameters
    "hybrid-1b": ModelConfig(
        name="hybrid-1b", layers=_pattern(16, 4), hidden=2048, ffn=5632, vocab=151936,
        q_heads=16, kv_heads=2, head_dim=256,
        gdn_qk_heads=16, gdn_v_heads=32, gdn_qk_dim=128, gdn_v_dim=128, gdn_conv_kernel=4,
        rope_theta=10000000.0,
    ),
}


#: appended to a preset's name: the same model with float16-valued weights
WEIGHTS_F16_SUFFIX = "+f16"
#: appended to a preset's name: the same model with float16 KV caches (compute float32);
#: composes with WEIGHTS_F16_SUFFIX in either order (``llama-1b+f16+f16kv``)
KV_F16_SUFFIX = "+f16kv"
#: appended to a preset's name: every matrix weight 4-bit (ModelConfig.weights "q4")
Q4_SUFFIX = "+q4"
#: appended to a preset's name: 4-bit matrix weights, float16 activations and KV caches
#: (what transformers.js and onnxruntime-genai web pages call q4f16)
Q4F16_SUFFIX = "+q4f16"
_SUFFIXES = {WEIGHTS_F16_SUFFIX: {"weights": "float16"}, KV_F16_SUFFIX: {"kv_cache": "float16"},
             Q4_SUFFIX: {"weights": "q4"},
             Q4F16_SUFFIX: {"weights": "q4", "kv_cache": "float16", "dtype": "float16"}}
#: suffixes that set the weights' format: a name takes one at most
_WEIGHT_SUFFIXES = (WEIGHTS_F16_SUFFIX, Q4_SUFFIX, Q4F16_SUFFIX)


def preset_names() -> str:
    """The preset names ``preset`` accepts, in words (its error and the --preset help)."""
    return (f"{', '.join(PRESETS)}, each also with {WEIGHTS_F16_SUFFIX!r} "
            f"(float16-valued weights), {Q4_SUFFIX!r} (4-bit matrix weights) or "
            f"{Q4F16_SUFFIX!r} (4-bit matrix weights, float16 activations and KV caches), "
            f"and/or {KV_F16_SUFFIX!r} (float16 KV caches)")


def preset(name: str) -> ModelConfig:
    base, *rest = str(name).split("+")
    suffixes = ["+" + r for r in rest]
    bad = [x for x in suffixes if x not in _SUFFIXES]
    both = sum(x in _WEIGHT_SUFFIXES for x in suffixes) > 1  # two weight formats
    if base not in PRESETS or bad or both or len(set(suffixes)) != len(suffixes):
        raise UserError(f"unknown preset {name!r}; accepted: {preset_names()}")
    if not suffixes:
        return PRESETS[base]
    changes = {k: v for x in suffixes for k, v in _SUFFIXES[x].items()}
    return replace(PRESETS[base], name=name, **changes)


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a stable order (names follow HF Llama/Qwen3-Next)."""
    h, f = cfg.hidden, cfg.ffn
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens": (cfg.vocab, h)}
    for i, kind in enumerate(cfg.layers):
        p = f"layers.{i}."
        shapes[p + "input_norm"] = (h,)
        if kind == ATTENTION:
            shapes[p + "q_proj"] = (h, cfg.q_heads * cfg.head_dim)
            shapes[p + "k_proj"] = (h, cfg.kv_heads * cfg.head_dim)
            shapes[p + "v_proj"] = (h, cfg.kv_heads * cfg.head_dim)
            shapes[p + "o_proj"] = (cfg.q_heads * cfg.head_dim, h)
        else:
            qk = cfg.gdn_qk_heads * cfg.gdn_qk_dim
            shapes[p + "q_proj"] = (h, qk)
            shapes[p + "k_proj"] = (h, qk)
            shapes[p + "v_proj"] = (h, cfg.gdn_v_heads * cfg.gdn_v_dim)
            if cfg.gdn_conv_kernel:  # depthwise taps, one row a channel (q, k, v order)
                shapes[p + "conv1d"] = (cfg.gdn_conv_dim, cfg.gdn_conv_kernel)
            shapes[p + "a_proj"] = (h, cfg.gdn_v_heads)  # decay gate input
            shapes[p + "b_proj"] = (h, cfg.gdn_v_heads)  # beta (update rate) input
            shapes[p + "A_log"] = (cfg.gdn_v_heads,)
            shapes[p + "dt_bias"] = (cfg.gdn_v_heads,)
            shapes[p + "o_proj"] = (cfg.gdn_v_heads * cfg.gdn_v_dim, h)
        shapes[p + "post_norm"] = (h,)
        shapes[p + "gate_proj"] = (h, f)
        shapes[p + "up_proj"] = (h, f)
        shapes[p + "down_proj"] = (f, h)
    shapes["final_norm"] = (h,)
    if cfg.separate_head:
        shapes["lm_head"] = (h, cfg.vocab)
    return shapes


def is_quantised(cfg: ModelConfig, name: str, shape: tuple[int, ...]) -> bool:
    """Whether a "q4" model stores the tensor ``name`` of ``shape`` in 4 bits: every matrix
    but the embedding (the projections of attention, gated delta and MLP, and the LM head),
    as real exports; the conv's taps are no matrix product's weight and stay float."""
    return (cfg.weights == "q4" and len(shape) == 2 and name != "embed_tokens"
            and not name.endswith("conv1d"))


def quantised_names(cfg: ModelConfig) -> list[str]:
    """The tensors a "q4" model stores in 4 bits (``is_quantised``)."""
    return [n for n, s in weight_shapes(cfg).items() if is_quantised(cfg, n, s)]


def weights_bytes(cfg: ModelConfig) -> int:
    """The weights' bytes as the floor counts them: 2 a parameter when they are float16
    values, half a byte plus a float32 scale a block when 4-bit (ModelConfig.weights). Where
    the LM head is a tensor of its own, a step reads one row of the embedding (the gather),
    not the table; a tied table is read whole, as the head."""
    quantised = set(quantised_names(cfg))
    sizes = {n: int(np.prod(s)) for n, s in weight_shapes(cfg).items()}
    if cfg.separate_head:
        sizes["embed_tokens"] = cfg.hidden
    plain = sum(v for n, v in sizes.items() if n not in quantised)
    q4 = sum(sizes[n] for n in quantised)
    return plain * cfg.weight_bytes_per_parameter + q4 // 2 + q4 // Q4_BLOCK * 4


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per (seed, tensor name): a tensor never depends on which others exist."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def make_weight(cfg: ModelConfig, name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Deterministic float32 parameter with a scale that keeps activations O(1)."""
    rng = _rng(seed, name)
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("norm"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if leaf == "A_log":  # decay rate exp(A_log) in [1, 16], as Mamba2/Qwen3-Next initialise it
        return np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
    if leaf == "dt_bias":
        return rng.uniform(-2.0, 0.0, shape).astype(np.float32)
    if leaf == "embed_tokens":
        return rng.standard_normal(shape, dtype=np.float32)
    if leaf == "conv1d":  # a channel's output keeps its input's scale
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(shape[-1]))
    if leaf == "lm_head" and cfg.tied_embeddings:  # a tied model's head, stored on its own
        return np.ascontiguousarray(make_weight(cfg, "embed_tokens", shape[::-1], seed).T)
    w = rng.standard_normal(shape, dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(shape[0]))
    return w


def make_weight_as(cfg: ModelConfig, name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``make_weight``, rounded to float16 values (still float32) or to its 4-bit model
    (dequantised, float32) when the config says so: float16 weights, or float16
    activations (whose unquantised weights are float16 tensors)."""
    w = make_weight(cfg, name, shape, seed)
    if is_quantised(cfg, name, shape):
        return round_trip(w)
    half = "float16" in (cfg.weights, cfg.dtype)
    return w.astype(np.float16).astype(np.float32) if half else w


def make_weights(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """All parameters as float32 arrays (1.2B-parameter presets need ~5 GB)."""
    return {n: make_weight_as(cfg, n, s, seed) for n, s in weight_shapes(cfg).items()}


#: presets above this many parameters keep their weights in a file cache: generating 1.2B
#: normals takes ~40 s, mapping the cached file back takes well under a second
WEIGHTS_CACHE_MIN_PARAMS = 20_000_000


def default_cache_dir() -> Path:
    """Where generated weights and exported graphs are kept (`STATEBENCH_CACHE` overrides)."""
    return Path(os.environ.get("STATEBENCH_CACHE", Path.home() / ".cache" / "statebench"))


def config_key(cfg: ModelConfig, seed: int) -> str:
    """A name that changes whenever the shapes or the seed do."""
    d = asdict(cfg)
    if d["kv_cache"] == "float32":
        del d["kv_cache"]  # keys made before the field existed stay valid
    if not d["gdn_conv_kernel"]:
        del d["gdn_conv_kernel"]  # likewise (a model without GDN layers has no conv)
    digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
    return f"{cfg.name}-{digest}-s{seed}"


def cached_weights(cfg: ModelConfig, seed: int, directory: Path | None = None) -> dict[str, np.ndarray]:
    """`make_weights`, read back from a raw float32 file (memory-mapped) once it exists.

    The file is written to a temporary name and renamed, so concurrent workers and an
    interrupted run never see a half-written cache, and it is reused only while its content
    checksum holds (`model.checksum`): the reference and every backend read these weights, so
    a corrupt file would otherwise match everywhere.
    """
    shapes = weight_shapes(cfg)
    path = (directory or default_cache_dir()) / "weights" / f"{config_key(cfg, seed)}.f32"
    total = sum(int(np.prod(s)) for s in shapes.values())
    if not checksum.reusable(path, "weights", size=total * 4):
        with atomic_file(path) as f:
            for name, shape in shapes.items():
                f.write(make_weight_as(cfg, name, shape, seed).tobytes())
        checksum.seal(path)
    flat = np.memmap(path, dtype=np.float32, mode="r", shape=(total,))
    out, offset = {}, 0
    for name, shape in shapes.items():
        n = int(np.prod(shape))
        out[name] = flat[offset:offset + n].reshape(shape)
        offset += n
    return out


def token_stream(cfg: ModelConfig, length: int, seed: int = 0) -> np.ndarray:
    """The teacher-forced token ids every backend and oracle is fed (int64)."""
    return _rng(seed, "tokens").integers(0, cfg.vocab, size=length, dtype=np.int64)


@dataclass(frozen=True)
class CacheSpec:
    """One state tensor a graph carries from step to step, named as exported decoders name it.

    kind "append": a fixed-capacity KV cache (1, kv_heads, capacity, head_dim), BNSH as
    GroupQueryAttention; one row per token is written. kind "overwrite", replaced every
    token: a GDN layer's conv window (1, conv_dim, kernel-1), the last kernel-1 columns of
    its conv input, oldest first (onnxruntime-genai's and CausalConvWithState's layout), and
    its recurrent state (1, v_heads, v_dim, qk_dim), V-major as ORT GatedDeltaNet and the
    standard flavour (``layout`` "k-major": (1, v_heads, qk_dim, v_dim), as ORT
    LinearAttention, which the ORT flavour uses; ``in_layout`` converts).
    """

    input: str
    output: str
    shape: tuple[int, ...]
    kind: str
    layer: int
    dtype: str = "float32"  # the tensor's data type (append pairs: ModelConfig.kv_cache)
    layout: str = ""  # a recurrent state's: V_MAJOR or K_MAJOR; "" for every other spec

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


#: a recurrent state's layouts (CacheSpec.layout)
V_MAJOR = "v-major"
K_MAJOR = "k-major"


def cache_specs(cfg: ModelConfig, capacity: int, state_layout: str = V_MAJOR) -> list[CacheSpec]:
    """The (past -> present) pairs of the decode graph, in layer order; recurrent states
    in ``state_layout`` (the reference's and the standard flavour's is V_MAJOR)."""
    if state_layout not in (V_MAJOR, K_MAJOR):
        raise ValueError(f"state layout {state_layout!r}; accepted: {V_MAJOR}, {K_MAJOR}")
    specs: list[CacheSpec] = []
    for i, kind in enumerate(cfg.layers):
        if kind == ATTENTION:
            shape = (1, cfg.kv_heads, capacity, cfg.head_dim)
            for part in ("key", "value"):
                specs.append(CacheSpec(f"past_key_values.{i}.{part}", f"present.{i}.{part}",
                                       shape, "append", i, cfg.kv_cache))
        else:
            if cfg.gdn_conv_kernel:
                window = (1, cfg.gdn_conv_dim, cfg.gdn_conv_kernel - 1)
                specs.append(CacheSpec(f"past_conv_state.{i}", f"present_conv_state.{i}",
                                       window, "overwrite", i))
            dims = (cfg.gdn_v_dim, cfg.gdn_qk_dim)
            shape = (1, cfg.gdn_v_heads, *(dims if state_layout == V_MAJOR else dims[::-1]))
            specs.append(CacheSpec(f"past_state.{i}", f"present_state.{i}", shape, "overwrite",
                                   i, layout=state_layout))
    return specs


def in_layout(spec: CacheSpec, array: np.ndarray) -> np.ndarray:
    """``array``, a state in the reference's layout (``cache_specs`` default), in the
    spec's: a K_MAJOR recurrent state is the V_MAJOR one with its last two axes swapped."""
    return array.swapaxes(-1, -2) if spec.layout == K_MAJOR else array


def valid_cache_bytes(cfg: ModelConfig, depth: int) -> int:
    """Bytes of cache a step at `depth` must read: valid KV rows plus whole recurrent states
    and conv windows."""
    total = 0
    for spec in cache_specs(cfg, max(depth, 1)):
        if spec.kind == "append":
            total += cfg.kv_heads * depth * cfg.head_dim * cfg.kv_bytes_per_element
        else:
            total += spec.nbytes
    return total


@dataclass
class Workload:
    """A model plus its weights: what `prepare` hands every backend."""

    config: ModelConfig
    seed: int = 0
    weights: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(cls, config: ModelConfig, seed: int = 0) -> Workload:
        big = config.describe()["parameters"] >= WEIGHTS_CACHE_MIN_PARAMS
        weights = cached_weights(config, seed) if big else make_weights(config, seed)
        return cls(config=config, seed=seed, weights=weights)

    @property
    def weights_bytes(self) -> int:
        """The weights' bytes as the floor counts them (``weights_bytes``)."""
        return weights_bytes(self.config)
