"""The knobs of the wgpu implementation (``KernelOptions``): kernel variants and context modes
for benchmarks, A/B runs and tests, and how each is resolved for an adapter when left to None.

A context is created with them (``ml.create_context(options=...)``) and hands them to the
compiler at each build; nothing reads them from a global. Why each default is what it is:
backends/webnn/PERFORMANCE.md, "Knobs".
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .target import Target

#: gemv_cols variants: (columns per invocation, workgroup size, workgroups; 0: all blocks)
COLS = {"cols": (8, 32, 8), "cols2": (2, 64, 0), "cols4": (4, 64, 0), "cols4g8": (4, 64, 8),
        "cols8g8": (8, 32, 8), "cols2g4": (2, 64, 4), "cols2g16": (2, 64, 16),
        "cols4g4": (4, 32, 4), "cols1g8": (1, 64, 8)}


#: gemv_rows variants: ``rows[LANES][_sh][_uDEPTH][_w]`` (invocations per weight row, default
#: 32; ``_sh``: sums through workgroup memory, not subgroupAdd; vec4 loads in flight, default 4;
#: ``_w``: float16 weights loaded 8 to a 16-byte load, not 4 to an 8-byte one)
ROWS_VARIANT = re.compile(r"rows(\d+)?(_sh)?(?:_u(\d+))?(_w)?")


GDN_VARIANT = re.compile(r"fused(\d+)?(_sh)?(_norms)?(_cols(\d+)?)?")
#: rows a workgroup of the gated delta's K-major column layout ("_cols" without ROWS): a warp
#: on NVIDIA, so each of a warp's state loads is one contiguous run
GDN_COL_ROWS = 32

#: q4_gemv's several-rows variants: ``multi[ROWS][_lLANES][_gGROUPS][_uUNROLL][_h]`` (output
#: rows an invocation computes, default 4; invocations sharing them, default 32; groups of
#: them a workgroup, default ``kernels/quant_rows.multi_groups``; code loads a row an iteration,
#: default 1; ``_h``: products in float16 pairs where the adapter has 'shader-f16' and the
#: weights are float16)
Q4_VARIANT = re.compile(r"multi(\d+)?(?:_l(\d+))?(?:_g(\d+))?(?:_u(\d+))?(_h)?")

#: q4_gemv's all-loads-in-flight variants: ``wide[ROWS][_kLOADS][_h]`` (output rows an
#: invocation computes, 1 to 4, default 1; 16-byte code loads a row an invocation, 1 to 4,
#: default 1; ``_h`` as for multi): ``kernels/quant_rows.gemv_q4_wide``
WIDE_VARIANT = re.compile(r"wide(\d+)?(?:_k(\d+))?(_h)?")

#: q4_gemv's four-rows-a-load variants: ``quad[_kLOADS][_h|_i8]`` (16-byte loads, each a
#: code word of 4 rows, an invocation makes, 1 to 4, default 1; ``_h`` as for multi; ``_i8``:
#: the input split into two int8 parts, the codes times them as integer dot products):
#: ``kernels/quant_rows.gemv_q4_quad``
QUAD_VARIANT = re.compile(r"quad(?:_k(\d+))?(_h|_i8)?")

#: what a bad q4_gemv value is told it may be
Q4_FORMS = ("'multi[ROWS][_lLANES][_gGROUPS][_uUNROLL][_h]' (e.g. 'multi', 'multi2_u2_h'), "
            "'wide[ROWS][_kLOADS][_h]' (e.g. 'wide', 'wide2_h'), 'quad[_kLOADS][_h|_i8]'")

#: the several-row 4-bit products by column: ``cols[PER][_cCOLS][_h]`` (PER columns an
#: invocation, 1, 2 or 4, default 1; COLS columns a slice-group of a workgroup, 8, 16 or 32,
#: default ``quant.cols_shape``'s choice; ``_h``: float16 products where the adapter has
#: 'shader-f16' and the weights are float16, as for q4_gemv's ``_h``):
#: ``kernels/quant.gemm_q4_cols``
Q4_COLS_VARIANT = re.compile(r"cols([124])?(?:_c(8|16|32))?(_h)?")

#: decode attention's lane-group variants: ``lanes[1][_uUNROLL]`` ("1": the combine folded in;
#: cache rows a lane-group loads before using any, default ``attention_lanes.UNROLL``)
LANES_VARIANT = re.compile(r"lanes(1)?(?:_u(\d+))?")

#: decode attention of many q rows a workgroup: ``tile[_tROWS]`` (cache rows a split, default
#: ``attention_tile.TILE_ROWS``): ``kernels/attention_tile.flash_tile``
TILE_VARIANT = re.compile(r"tile(?:_t(32|64|128|256))?")

#: cache rows from which a GPU adapter's default decode attention of many q rows (a K-token
#: verify's) is "tile" (measured better on an H100 at 8200 rows for a K = 4 verify:
#: PERFORMANCE.md)
TILE_DEFAULT_ROWS = 8192
#: the same for a one-token step's head (with the statistics by subgroups, ``attention_sync``:
#: tile better on an H100 at 2056, 4104 and 8200 rows, flash at 544 and 1032: PERFORMANCE.md,
#: "The 4-bit codes as integer dot products, and attention's statistics by subgroups")
TILE_DEFAULT_ROWS_ONE = 2048

#: splits up to which a GPU adapter's two-launch attention has its combine computed by the o
#: product's workgroups (``attention_combine``): faster than its launch at few splits, slower
#: at many, every o workgroup reading all the partials (PERFORMANCE.md, "The combine computed
#: by the o product"); 16 is where ``kernels/attention.combine_vector`` stops unrolling.
#: Beyond it a tile attention's last workgroups combine (faster than the launch at 17 to 33)
COMBINE_PRODUCT_SPLITS = 16
#: q rows a workgroup up to which the GPU default combines a tile's splits in its last
#: workgroups (a one-token head's, as timed)
LAST_DEFAULT_ROWS = 4

#: q rows a KV head above which ``KernelOptions.attention_rows`` picks the attention (a
#: one-token step has a head's GQA rows, 4 on llama-1b; a K = 4 verify has 16)
MANY_Q_ROWS = 8

#: the attention variants ``match_attention`` lowers itself (the rest stay on matmuls)
FLASH_VARIANTS = (None, "flash", "flash1")

#: the knobs that are counts, and what they count
COUNTS = {"attention_splits": "the splits per head",
          "attention_q_rows": "the q rows a workgroup scores"}

#: the accepted string values of each knob (None is always accepted: chosen per adapter);
#: gemv, gdn and the COUNTS are checked by their own rules in ``_check``
CHOICES: dict[str, tuple[str, ...]] = {
    "attention": ("flash", "flash1", "unfused", "generic"),
    "attention_rows": ("flash", "flash1", "unfused", "generic"),
    "gemv_prologue": ("launch", "off", "full", "vector"),
    "q4_prologue": ("off", "vector", "full"),
    "q4_epilogue": ("off", "gated"),
    "q4_norms": ("partials", "shared", "off"),
    "gemv_epilogue": ("off", "gated"),
    "gemv_norms": ("partials", "off"),
    "attention_writes": ("fold", "off"),
    "tile_pv": ("lanes", "walk"),
    "attention_loads": ("scores", "first", "kv"),
    "attention_sync": ("subgroups", "trees"),
    "attention_combine": ("launch", "product", "last"),
    "gdn_replay": ("fused", "launch"),
    "row_vector": ("unrolled", "loop"),
    "row_writes": ("separate",),
    "record_ahead": ("on", "pieces", "off"),
    "cache_copy": ("vec4", "identity", "buffer"),
    "gemv_weights": ("f32", "f16"),
    "f16_loads": ("wide", "vec4"),
    "read_copy": ("dispatch", "separate", "separate_sync"),
    "q4_gemv": ("fused", "generic"),
    "pass_calls": ("direct", "wgpu-py"),
    "map_wait": ("spin", "caller", "thread"),
    "queue_calls": ("direct", "direct_maps", "wgpu-py"),
}


@dataclass(frozen=True)
class KernelOptions:
    """Kernel variants and context modes; None everywhere is the per-adapter default.

    Frozen: a context keeps the options it was created with; ``replace`` and ``parse``
    make new ones. A bad value raises ValueError naming the knob and what it accepts.
    """

    #: matrix-vector kernel: None (CPU adapters "cols", GPUs "rows"), "legacy", a ``COLS`` key,
    #: "rows[LANES][_sh][_uDEPTH][_w]" (``ROWS_VARIANT``)
    gemv: str | None = None
    #: decode attention: None/"flash" (two launches where the pattern matches), "flash1" (one
    #: launch, the combine folded into each head's last split: ``flash_decode_one``; else as
    #: "flash"), "lanes[1][_uUNROLL]" (``LANES_VARIANT``: lane-groups over whole cache rows, an
    #: online softmax in registers, ``attention_lanes.flash_lanes``; two launches, "lanes1" one
    #: with the combine folded in as "flash1" does; else as "flash"), "tile[_tROWS]"
    #: (``TILE_VARIANT``: a split's rows scored for all of a head's q rows, up to 16, by one
    #: workgroup, ``attention_tile.flash_tile``; else as "flash"), "unfused" (QK, chain,
    #: softmax, split-K probs·V), "generic" (plain matmuls)
    attention: str | None = None
    #: decode attention where a KV head scores more than ``MANY_Q_ROWS`` q rows (a K-token
    #: verify's, a prefill chunk's): None (as ``attention``), or one of ``attention``'s values
    attention_rows: str | None = None
    #: a gemv's input vector reading a one-element reduction (RMSNorm): None/"launch" (both in
    #: one launch of their own), "off" (each its own launch), "full" (both computed by each
    #: gemv workgroup), "vector" (the vector by each gemv workgroup, the reduction launched)
    gemv_prologue: str | None = None
    #: a 4-bit product's input vector (``q4_gemv`` "quad" variants): None/"off" (as
    #: ``gemv_prologue`` decides), "vector" (a vector reading no reduction, SwiGLU's product,
    #: computed by the product's workgroups where they read it), "full" (RMSNorm too, each
    #: workgroup computing the mean of squares while its code loads are in flight)
    q4_prologue: str | None = None
    #: what a stacked pair of 4-bit products (``q4_gemv`` "quad" variants) writes: None (GPU
    #: adapters "gated", CPU adapters "off"), "off" (both products), "gated" (the element-wise
    #: group reading only the two, SwiGLU's ``silu(gate) · up``, computed as the sums are
    #: written: no launch of its own)
    q4_epilogue: str | None = None
    #: RMSNorm between two 4-bit products (``q4_gemv`` "quad" variants), its mean of squares
    #: over the residual stream the first writes (``gemv.norm_partials``): None (GPU adapters
    #: "shared", CPU adapters "off"), "partials" (the writing product's workgroups each
    #: sum the squares of the rows they write; the norm's readers sum those partial sums and
    #: compute the norm where they read it: no launch of its own), "shared" (as "partials",
    #: a one-row reader computing its input once a workgroup in workgroup memory), "off" (as
    #: ``gemv_prologue``/``q4_prologue`` decide: by default one launch a norm). A K-token
    #: verify's products of several rows alike where they run "quad" or by column
    #: (``q4_rows``), a reduction a row
    q4_norms: str | None = None
    #: what a stacked pair of float-weight products (the GPU "rows" kernels) writes: None
    #: (GPU adapters "gated", CPU adapters "off"), "off" (both products), "gated" (the
    #: element-wise group reading only the two, SwiGLU's ``silu(gate) · up``, written by
    #: their launch, the pair's rows laid out together: no launch of its own), as
    #: ``q4_epilogue`` for 4-bit ones
    gemv_epilogue: str | None = None
    #: RMSNorm between two float-weight products (the GPU "rows" kernels), its mean of
    #: squares over the residual stream the first writes (``gemv.norm_partials``): None
    #: (GPU adapters "partials", CPU adapters "off"), "partials" (the writing product's
    #: workgroups each sum the squares of the rows they write; the norm's readers sum those
    #: and compute the norm where they read it: no launch of its own), "off" (as
    #: ``gemv_prologue`` decides); as ``q4_norms`` for 4-bit ones
    gemv_norms: str | None = None
    #: a vector and its row reduction in one launch (``kernels/matmul.computed_vector``, the
    #: launch of "launch" above; RMSNorm, L2 norms per head): None/"unrolled" (a workgroup no
    #: wider than the row, each invocation's loads straight-line, subgroup sums where the
    #: subgroup is one fixed width), "loop" (256 invocations striding in loops, a tree of
    #: barriers)
    row_vector: str | None = None
    #: scatters of one index tensor into same-shaped caches: None (one launch), "separate"
    row_writes: str | None = None
    #: a layer's K and V row writes in the stateful graph (``match_attention.fold_row_writes``):
    #: None (GPU adapters "fold", CPU adapters "off"), "fold" (written by the two-launch
    #: flash attention's first launch, each workgroup the new rows of its split: no launch of
    #: their own), "off" (as ``row_writes`` decides)
    attention_writes: str | None = None
    #: probs·V of the tile attention's one-token head (``attention_tile._lane_pv``): None /
    #: "lanes" (at a fixed subgroup width: every V word an invocation needs loaded before the
    #: softmax's statistics, the row shares summed by subgroupAdd), "walk" (each invocation
    #: walks its rows four V words at a time after the statistics)
    tile_pv: str | None = None
    #: when the two-launch attentions' (tile, flash) invocations load their K words and
    #: the V words they hold in registers: None / "scores" (K after q is in workgroup
    #: memory; V after the scores, flash's after q's statistics), "first" (both at the
    #: kernel's start, before a folded row write and q's chain; the workgroup that wrote a
    #: row of its split loads them again after the write; flash only where an invocation
    #: scores one row in one batch of loads), "kv" (tile only, where ``tile_pv`` "lanes"
    #: holds the V words: V's issued after q is in workgroup memory, just before K's, so
    #: the two reads are in flight together; flash as "scores")
    attention_loads: str | None = None
    #: how the two-launch attentions (flash, tile) meet a split's softmax statistics and
    #: their combine the splits' weights: None (GPU adapters "subgroups", CPU adapters
    #: "trees"), "subgroups" (at the adapter's fixed subgroup
    #: width: subgroupMax/subgroupAdd and one barrier each; flash's float16 probs·V row-groups
    #: by shuffles, its V words loaded before the scores where few; ``attention_subgroup``),
    #: "trees" (workgroup trees and serial walks, the kernels before)
    attention_sync: str | None = None
    #: where a two-launch attention's (flash, tile) splits are combined: None (GPU adapters
    #: "product" up to ``COMBINE_PRODUCT_SPLITS`` splits, else "launch"), "launch" (a
    #: launch of its own), "product" (by each workgroup of the one-row product that alone
    #: reads the attention's output, the o projection on the 4-bit "quad" or the float rows
    #: kernel, into its workgroup memory before its sums: ``kernels/attention.combine_vector``;
    #: else a launch), "last" (by the last workgroup of each head to write its partials,
    #: in pass 1 of flash or tile: ``attention.last_combine``); unset, GPU adapters take
    #: "last" for a one-token tile head beyond ``COMBINE_PRODUCT_SPLITS`` splits
    attention_combine: str | None = None
    #: splits per head flash-decoding aims at on long caches: None (``kernels/attention.SPLITS``;
    #: "flash1": ``SPLITS1``; "lanes", "lanes1": ``attention_lanes.SPLITS_L``)
    attention_splits: int | None = None
    #: q rows a two-launch flash attention workgroup scores (``kernels/attention.q_row_groups``):
    #: None (``attention_group_rows``: on GPU adapters 1 for a one-token head, else
    #: ``GROUP_ROWS``, 2: a head's rows split along the grid's z), a count
    #: (at least one; a head's rows or more: one workgroup a split for all of them), cut
    #: to the largest divisor whose rows fit workgroup memory
    attention_q_rows: int | None = None
    #: encode each dispatch's successor while the device runs it (``dispatch._record_ahead``):
    #: None (GPUs on, CPU adapters off), "on" (its command buffers in one submit), "pieces"
    #: (submitted one by one), "off" (every dispatch encodes its own)
    record_ahead: str | None = None
    #: how a non-stateful scatter copies the unchanged cache into its output: None/"vec4"
    #: (float32 and float16 caches: a vec4 copy kernel, 256 invocations a workgroup; else as
    #: "identity"), "identity" (the element-wise kernel, one value per invocation), "buffer"
    #: (copy_buffer_to_buffer: splits the pass)
    cache_copy: str | None = None
    #: constant weights of the GPU gemv kernels: None (float16 where every value of the constant
    #: is a float16 value, so nothing is lost; else float32), "f32", "f16" (always: lossy unless
    #: the weights are float16 values)
    gemv_weights: str | None = None
    #: a gated delta net's decode step (``match_gdn``): None (one launch on GPU adapters, the
    #: generic ops on CPU adapters), "generic" (the ops one by one), "fused[LANES][_sh][_norms]"
    #: (one launch on any adapter; LANES invocations per state row, default 32; "_sh": sums
    #: through workgroup memory, not subgroupAdd; "_norms": q's and k's L2 norms launched apart;
    #: "_cols[ROWS]": a K-major state (ORT LinearAttention's, genai's exports) read a column a
    #: lane, ROWS rows a workgroup (default 32, a power of two up to 256), so a warp's loads
    #: are contiguous: ``kernels/gdn.gated_delta``'s ``cols``; LANES and "_sh" then do not apply)
    gdn: str | None = None
    #: a rollback's replay the graph spells just before a verify pass with capture, from
    #: the state that pass reads (``match_gdn_capsule.fuse_replays``): None/"fused" (computed
    #: by the capture's launch: one launch and one pass over the state fewer a GDN layer),
    #: "launch" (its own ``gdn_replay`` launch, as measured alone by
    #: ``harness.speculative.webnn_rollback``)
    gdn_replay: str | None = None
    #: how flash-decoding loads a float16 cache: None/"wide" (16-byte ``vec4<u32>`` loads of 8
    #: halves where the head dimension is a multiple of 8; else as "vec4"), "vec4" (``vec4<f16>``
    #: loads of 4 halves, or ``f16`` when d % 4 != 0)
    f16_loads: str | None = None
    #: readable outputs: None/"dispatch" (copied to staging at the end of the dispatch, so a read
    #: right after only maps: ``readback._read_copy_for``), "separate" (each read copies in a
    #: submit of its own), "separate_sync" (the same, each map after wgpu-py's empty submit)
    read_copy: str | None = None
    #: one-row products with 4-bit weights (``match_q4``): None (GPU adapters "quad_k4_h",
    #: CPU adapters "fused": ``q4_variant``), "fused" (the codes read and
    #: dequantised in registers, 32 invocations a row),
    #: "multi[ROWS][_lLANES][_gGROUPS][_uUNROLL][_h]" (``Q4_VARIANT``: the same, ROWS rows an
    #: invocation, float16 scales read as pairs where exact; ``_h``: float16 products where the
    #: adapter has 'shader-f16' and the weights are float16, else without),
    #: "wide[ROWS][_kLOADS][_h]" (``WIDE_VARIANT``: every code load of an invocation in flight
    #: at once), "quad[_kLOADS][_h|_i8]"
    #: (``QUAD_VARIANT``: 4 rows' codes a load, coalesced inputs), "generic"
    #: (dequantizeLinear writes float weights, then matmul)
    q4_gemv: str | None = None
    #: how a compute pass's launches are encoded (``engines.Engine.pass_calls``): None/"direct"
    #: (the engine's C functions called directly), "wgpu-py" (wgpu-py's pass methods)
    pass_calls: str | None = None
    #: how a read map waits for the device (``staging.MapHow``): None (GPU adapters "spin",
    #: CPU adapters "caller"), "spin" (the caller polls without blocking until the map is
    #: done; both engines), "caller" (the caller blocks in the device's poll; Dawn's own
    #: wait, which "thread" is too there), "thread" (wgpu-native: wgpu-py's poll thread
    #: waits and wakes the caller)
    map_wait: str | None = None
    #: how a step's queue calls on its critical path are made (``engines.Engine.queue_calls``:
    #: the submit, small writes, the spinning wait's poll): None/"direct" (the engine's C
    #: functions), "direct_maps" (the same, and where the read map spins, the map itself, its
    #: read and unmap through C: no wgpu-py promise or poll thread), "wgpu-py" (wgpu-py's methods)
    queue_calls: str | None = None
    #: the several-row 4-bit products (a K-token verify's, ``match_q4`` rows): None (GPU
    #: adapters "cols", CPU adapters "rows"), "rows" (``quant.gemm_q4_rows``: lanes share a
    #: column), "quad" (``quant_quad_rows.gemm_q4_quad``: the one-token quad layout, every
    #: code dequantised once for the K rows; where the weights do not allow it, "cols"),
    #: "cols" (``quant.gemm_q4_cols``: an invocation a column, codes laid out by
    #: load), "cols2"/"cols4" (2 or 4 columns an invocation, each input load used for all),
    #: "_cCOLS" after either (``Q4_COLS_VARIANT``: columns a workgroup's slice-group, else
    #: ``quant.cols_shape`` widens K's slices on narrow products to fill the device), "_h"
    #: last ("cols_h", "cols2_h", "cols4_c8_h": ``q4_cols_half``; opt-in, not yet timed on a
    #: GPU): the products in float16 pairs, summed in float16 a load and in float32 after,
    #: only where the adapter has 'shader-f16' and the product's weights are float16 (a
    #: float16 graph's, as q4_gemv's "_h"); elsewhere "_h" is dropped silently ("cols_h"
    #: runs "cols"). Where "quad" falls back to "cols" it never takes "_h"
    q4_rows: str | None = None

    def q4_rows_variant(self, t: Target) -> str:
        return self.q4_rows or ("rows" if t.cpu else "cols")

    def q4_rows_quad(self, t: Target) -> bool:
        """Whether the several-row 4-bit products run on the one-token quad layout
        (``q4_rows`` "quad": ``kernels/quant_quad_rows``), where the weights allow it."""
        return self.q4_rows_variant(t) == "quad"

    def q4_cols(self, t: Target) -> tuple[int, int | None] | None:
        """(columns an invocation, columns a slice-group or None: ``cols_shape``'s) of the
        several-row products by column, or None where they run ``gemm_q4_rows``."""
        m = Q4_COLS_VARIANT.fullmatch(self.q4_rows_variant(t))
        if m is None:
            return None
        return int(m.group(1) or 1), int(m.group(2)) if m.group(2) else None

    def q4_cols_half(self, t: Target) -> bool:
        """Whether the several-row products by column (``q4_cols``) may multiply in float16
        (``q4_rows`` "_h"): asked for and the target has 'shader-f16'; the lowering takes
        it only on float16 weights (``match_q4.lower_q4_rows``)."""
        m = Q4_COLS_VARIANT.fullmatch(self.q4_rows_variant(t))
        return m is not None and bool(m.group(3)) and t.f16

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                _check(f.name, value)

    def replace(self, **changes: str | int | None) -> KernelOptions:
        """These options with ``changes`` (checked as the constructor checks them)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(cls, pairs: Iterable[str], base: KernelOptions | None = None) -> KernelOptions:
        """``base`` (default: all None) with each ``key=value`` (the A/B scripts' ``--option``
        syntax; an empty value is None)."""
        changes: dict[str, str | int | None] = {}
        known = [f.name for f in dataclasses.fields(cls)]
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"option {pair!r} is not KEY=VALUE")
            if key not in known:
                raise ValueError(f"unknown option {key!r}; known: {', '.join(known)}")
            changes[key] = _parse_value(key, value)
        return (base or cls()).replace(**changes)

    def as_dict(self) -> dict[str, str | int | None]:
        """Every knob and its value (JSON-ready: a point's ``details``)."""
        return dataclasses.asdict(self)

    def gemv_variant(self, t: Target, cols_ok: bool = True) -> str:
        """The matrix-vector kernel for this adapter (PERFORMANCE.md): one invocation per
        column on CPU adapters, ``lanes`` invocations per column with subgroup sums on GPUs."""
        v = self.gemv or ("cols" if t.cpu else "rows")
        if v.startswith("cols") and not cols_ok:
            v = "rows"
        return v

    def q4_variant(self, t: Target | None = None) -> str:
        """The 4-bit product's variant: ``q4_gemv``, or unset "quad_k4_h" on GPU adapters
        (the fastest in the H200's decode step: PERFORMANCE.md "4-bit gemv"; its float16
        products only in float16 graphs) and "fused" on CPU adapters and without a target."""
        return self.q4_gemv or ("quad_k4_h" if t is not None and not t.cpu else "fused")

    def q4_multi(self, t: Target | None = None
                 ) -> tuple[int, int, int | None, int, bool] | None:
        """(rows an invocation, lanes sharing them, row groups a workgroup or None: chosen
        per shape, unroll, float16 products) of ``kernels/quant_rows.gemv_q4_multi``, or None
        where the variant (``q4_variant``) is not a "multi" one. ``_h`` holds only where
        the target has 'shader-f16'."""
        m = Q4_VARIANT.fullmatch(self.q4_variant(t))
        if m is None:
            return None
        return (int(m.group(1) or 4), int(m.group(2) or 32),
                int(m.group(3)) if m.group(3) else None, int(m.group(4) or 1),
                bool(m.group(5)) and t is not None and t.f16)

    def q4_wide(self, t: Target | None = None) -> tuple[int, int, bool] | None:
        """(rows an invocation, code loads a row an invocation, float16 products: only
        where the target has 'shader-f16') of ``kernels/quant_rows.gemv_q4_wide``, or None where
        the variant (``q4_variant``) is not a "wide" one."""
        m = WIDE_VARIANT.fullmatch(self.q4_variant(t))
        if m is None:
            return None
        return (int(m.group(1) or 1), int(m.group(2) or 1),
                bool(m.group(3)) and t is not None and t.f16)

    def q4_quad(self, t: Target | None = None) -> tuple[int, bool] | None:
        """(16-byte loads an invocation, float16 products: only where the target has
        'shader-f16') of ``kernels/quant_rows.gemv_q4_quad``, or None where the variant
        (``q4_variant``) is not a "quad" one."""
        m = QUAD_VARIANT.fullmatch(self.q4_variant(t))
        if m is None:
            return None
        return int(m.group(1) or 1), m.group(2) == "_h" and t is not None and t.f16

    def q4_quad_ints(self, t: Target | None = None) -> bool:
        """Whether ``kernels/quant_rows.gemv_q4_quad`` multiplies the codes by the input
        split into two int8 parts (``q4_gemv`` "quad…_i8": ``ints``); the lowering takes it
        where the weights are float16 (a float16 graph's, as "_h"), have no zero points and
        workgroup memory holds the parts (``match_q4.lower_q4``), else the float32 products."""
        m = QUAD_VARIANT.fullmatch(self.q4_variant(t))
        return m is not None and m.group(2) == "_i8"

    def q4_gated(self, t: Target) -> bool:
        """Whether a stacked gate/up pair of 4-bit products writes its activation
        (``q4_epilogue``): by default on GPU adapters, where the "quad" kernel runs it
        (PERFORMANCE.md, "Knobs")."""
        how = self.q4_epilogue
        return (how == "gated" or (how is None and not t.cpu)) and self.q4_quad(t) is not None

    def q4_rows_gated(self, t: Target) -> bool:
        """Whether a stacked gate/up pair of several-row 4-bit products (a K-token verify's)
        writes its activation (``q4_epilogue``, as ``q4_gated``): where they run by column
        (``q4_cols``)."""
        how = self.q4_epilogue
        return ((how == "gated" or (how is None and not t.cpu))
                and (self.q4_cols(t) is not None or self.q4_rows_quad(t)))

    def q4_norm_partials(self, t: Target) -> bool:
        """Whether a norm between two 4-bit products is computed from partial sums the first
        writes (``q4_norms``): by default on GPU adapters, where the "quad" kernel runs
        (PERFORMANCE.md, "Knobs"); several-row products: ``q4_rows_norm_partials``."""
        how = self.q4_norms
        return ((how in ("partials", "shared") or (how is None and not t.cpu))
                and self.q4_quad(t) is not None)

    def q4_norm_shared(self, t: Target) -> bool:
        """Whether a one-row product computing a norm from partial sums computes its input
        once a workgroup into workgroup memory (``q4_norms`` "shared", the GPU default), not
        in each group of invocations where it reads it ("partials";
        ``quant_rows.gemv_q4_quad``'s ``shared_input``; PERFORMANCE.md, "Knobs")."""
        return self.q4_norms == "shared" or (self.q4_norms is None and not t.cpu)

    def gemv_gated(self, t: Target) -> bool:
        """Whether a stacked gate/up pair of float-weight products writes its activation
        (``gemv_epilogue``): by default on GPU adapters (PERFORMANCE.md, "Knobs"), where
        the rows kernels run them (``passes.gated_epilogues``)."""
        how = self.gemv_epilogue
        return how == "gated" or (how is None and not t.cpu)

    def gemv_norm_partials(self, t: Target) -> bool:
        """Whether a norm between two float-weight products is computed from partial sums
        the first writes (``gemv_norms``): by default on GPU adapters (PERFORMANCE.md,
        "Knobs"), where the rows kernels run them (``passes.gemv_prologues``)."""
        how = self.gemv_norms
        return how == "partials" or (how is None and not t.cpu)

    def q4_rows_norm_partials(self, t: Target) -> bool:
        """Whether a norm between two several-row 4-bit products (a K-token verify's) is
        computed from the partial sums the first writes (``q4_norms``, as
        ``q4_norm_partials``): where they run "quad" (``q4_rows_quad``: by default on GPU
        adapters) or by column (``q4_cols``: only where "partials" is asked for, until the
        GPU A/B against the norm launches, PERFORMANCE.md "A speculative verify");
        ``gemm_q4_rows`` does neither."""
        how = self.q4_norms
        if self.q4_rows_quad(t):
            return how == "partials" or (how is None and not t.cpu)
        return how == "partials" and self.q4_cols(t) is not None

    def attention_writes_fold(self, t: Target) -> bool:
        """Whether a layer's row writes are folded into its attention (``attention_writes``):
        by default on GPU adapters, and there only for one row a head (a one-token step:
        ``match_attention.fold_row_writes``' ``one_row``; PERFORMANCE.md, "Knobs")."""
        how = self.attention_writes
        return how == "fold" or (how is None and not t.cpu)

    def attention_for(self, q_rows: int) -> str | None:
        """The attention variant of a head scoring ``q_rows`` q rows: ``attention_rows``
        where set and the rows are more than ``MANY_Q_ROWS``, else ``attention``."""
        if q_rows > MANY_Q_ROWS and self.attention_rows is not None:
            return self.attention_rows
        return self.attention

    def attention_matched(self, q_rows: int | None = None) -> bool:
        """Whether the attention of a head scoring ``q_rows`` q rows runs on the matched
        kernels (flash or lanes); None: whether any attention may, so the graph's
        attention patterns are looked for."""
        if q_rows is not None:
            used = [self.attention_for(q_rows)]
        else:
            used = [self.attention] + ([self.attention_rows] if self.attention_rows else [])
        return any(v in FLASH_VARIANTS or LANES_VARIANT.fullmatch(v) is not None
                   or TILE_VARIANT.fullmatch(v) is not None for v in used)

    def attention_group_rows(self, q_rows: int, t: Target) -> int | None:
        """q rows a two-launch flash workgroup scores of a head's ``q_rows``
        (``attention_q_rows`` where set): on GPU adapters one for a one-token head (at most
        ``MANY_Q_ROWS``: four times the workgroups, each with a shorter chain), else None
        (``attention.GROUP_ROWS``, a verify's best; PERFORMANCE.md, "Knobs")."""
        if self.attention_q_rows is not None:
            return self.attention_q_rows
        return 1 if not t.cpu and q_rows <= MANY_Q_ROWS else None

    def attention_subgroup(self, t: Target) -> int | None:
        """The subgroup width the two-launch attentions meet their statistics and combine
        weights at (``attention_sync``): the target's fixed width, by default on GPU
        adapters (CPU adapters keep the trees unless "subgroups" is asked for)."""
        how = self.attention_sync
        return t.subgroup if how == "subgroups" or (how is None and not t.cpu) else None

    def attention_combine_product(self, t: Target, splits: int = 0) -> bool:
        """Whether a two-launch attention's combine of ``splits`` splits is computed by the
        product reading its output (``passes.attention_combines``): "product" always,
        "launch" never; left to the adapter (None), on GPU adapters up to
        ``COMBINE_PRODUCT_SPLITS`` splits, CPU adapters never."""
        how = self.attention_combine
        if how is None:
            return not t.cpu and splits <= COMBINE_PRODUCT_SPLITS
        return how == "product"

    def attention_combine_last(self, t: Target, splits: int, q_rows: int = 1,
                               tile: bool = True) -> bool:
        """Whether a two-launch attention's combine of ``splits`` splits for ``q_rows`` q
        rows (a workgroup's, or flash's head's) is computed by each head's last workgroup in
        pass 1 (``attention.last_combine``): "last" always, "launch" and "product" never;
        left to the adapter, on GPU adapters for a one-token tile head (at most
        ``LAST_DEFAULT_ROWS`` rows; a verify's and flash's are not timed) beyond
        ``COMBINE_PRODUCT_SPLITS`` splits (where the product's reads of every split cost
        more than a launch), where the engine's storage barrier has device scope
        (``Target.device_barrier``: wgpu-native's, not Dawn's), CPU adapters never."""
        how = self.attention_combine
        if how is None:
            return (tile and not t.cpu and t.device_barrier
                    and splits > COMBINE_PRODUCT_SPLITS and q_rows <= LAST_DEFAULT_ROWS)
        return how == "last"

    def attention_lanes(self, q_rows: int = 1) -> tuple[bool, int | None] | None:
        """(combine folded in, rows a lane-group loads at once or None: the default) of the
        lane-group attention of a head scoring ``q_rows`` q rows, or None where its
        variant (``attention_for``) is not a "lanes" one."""
        m = LANES_VARIANT.fullmatch(self.attention_for(q_rows) or "")
        if m is None:
            return None
        return bool(m.group(1)), int(m.group(2)) if m.group(2) else None

    def attention_tile(self, q_rows: int = 1, capacity: int = 0,
                       t: Target | None = None) -> tuple[int | None] | None:
        """(cache rows a split, None: the default) of the many-rows attention of a head
        scoring ``q_rows`` q rows over ``capacity`` cache rows, or None where its variant
        (``attention_for``) is not a "tile" one. Left to the adapter (None), a GPU's
        (``t``) attention is "tile" from ``TILE_DEFAULT_ROWS_ONE`` cache rows on for a
        one-token step's head (256 rows a split) and from ``TILE_DEFAULT_ROWS`` for many rows
        (the default 128) (PERFORMANCE.md, "One workgroup for all of a head's rows")."""
        how = self.attention_for(q_rows)
        many = q_rows > MANY_Q_ROWS
        if (how is None and t is not None and not t.cpu
                and capacity >= (TILE_DEFAULT_ROWS if many else TILE_DEFAULT_ROWS_ONE)):
            return (None if many else 256,)
        m = TILE_VARIANT.fullmatch(how or "")
        if m is None:
            return None
        return (int(m.group(1)) if m.group(1) else None,)

    def gdn_variant(self, t: Target) -> tuple[int, bool, bool, int] | None:
        """(lanes per state row, sums through workgroup memory, fold q's and k's L2 norms, the
        rows a workgroup of a K-major state read a column a lane, 0: by rows) of the gated
        delta kernel, or None for the generic ops (by default the kernel on GPU adapters only,
        PERFORMANCE.md)."""
        how = self.gdn
        if how == "generic" or (how is None and t.cpu):
            return None
        m = GDN_VARIANT.fullmatch(how or "fused")
        assert m is not None  # checked at construction
        cols = int(m.group(5) or GDN_COL_ROWS) if m.group(4) else 0
        return int(m.group(1) or 32), bool(m.group(2)), not m.group(3), cols


def _parse_value(key: str, value: str) -> str | int | None:
    """A knob's value from its text: "" is None; attention_splits and attention_q_rows are
    counts."""
    if not value:
        return None
    if key in COUNTS:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{key} = {value!r}: not a whole number") from None
    return value


def _check(name: str, value: object) -> None:
    """ValueError unless ``value`` is one the knob ``name`` accepts."""
    if name in COUNTS:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"KernelOptions.{name} = {value!r}; accepted: None or a "
                             f"positive int ({COUNTS[name]})")
        return
    if not isinstance(value, str):
        raise ValueError(f"KernelOptions.{name} = {value!r}; accepted: None or a string")
    if name == "gemv":
        if value != "legacy" and value not in COLS and not ROWS_VARIANT.fullmatch(value):
            raise ValueError(f"KernelOptions.gemv = {value!r}; accepted: None, 'legacy', "
                             f"{', '.join(map(repr, COLS))}, 'rows[LANES][_sh][_uDEPTH][_w]' "
                             "(e.g. 'rows', 'rows16_sh_u2', 'rows_u8_w')")
    elif name == "gdn":
        if value == "generic":
            return
        m = GDN_VARIANT.fullmatch(value)
        if m is None:
            raise ValueError(f"KernelOptions.gdn = {value!r}; accepted: None, 'generic', "
                             "'fused[LANES][_sh][_norms][_cols[ROWS]]' (e.g. 'fused', "
                             "'fused8_sh', 'fused_cols', 'fused_cols16')")
        lanes = int(m.group(1) or 32)
        if lanes < 1 or lanes > 256 or lanes & (lanes - 1):
            raise ValueError(f"KernelOptions.gdn = {value!r}: lanes per state row must be a "
                             "power of two from 1 to 256")
        rows = int(m.group(5) or GDN_COL_ROWS)
        if rows < 1 or rows > 256 or rows & (rows - 1):
            raise ValueError(f"KernelOptions.gdn = {value!r}: rows a workgroup (_colsROWS) "
                             "must be a power of two from 1 to 256")
    elif name == "q4_gemv" and Q4_VARIANT.fullmatch(value):
        m = Q4_VARIANT.fullmatch(value)
        rows, lanes, groups, unroll = (int(m.group(i) or d)
                                       for i, d in ((1, 4), (2, 32), (3, 1), (4, 1)))
        if not (1 <= lanes <= 256 and lanes & (lanes - 1) == 0 and 1 <= rows <= min(lanes, 16)
                and 1 <= groups and groups * lanes <= 256 and 1 <= unroll <= 4):
            raise ValueError(f"KernelOptions.q4_gemv = {value!r}: lanes a power of two to "
                             "256, rows 1 to min(lanes, 16), groups · lanes at most 256, "
                             "unroll 1 to 4")
    elif name == "q4_gemv" and QUAD_VARIANT.fullmatch(value):
        if not 1 <= int(QUAD_VARIANT.fullmatch(value).group(1) or 1) <= 4:
            raise ValueError(f"KernelOptions.q4_gemv = {value!r}: loads 1 to 4")
    elif name == "q4_gemv" and WIDE_VARIANT.fullmatch(value):
        m = WIDE_VARIANT.fullmatch(value)
        if not (1 <= int(m.group(1) or 1) <= 4 and 1 <= int(m.group(2) or 1) <= 4):
            raise ValueError(f"KernelOptions.q4_gemv = {value!r}: rows 1 to 4, loads 1 to 4")
    elif name == "q4_rows":
        if value not in ("rows", "quad") and not Q4_COLS_VARIANT.fullmatch(value):
            raise ValueError(f"KernelOptions.q4_rows = {value!r}; accepted: None, 'rows', "
                             "'quad', 'cols[PER][_cCOLS][_h]' (PER 1, 2 or 4; COLS 8, 16 or "
                             "32; _h: float16 products; e.g. 'cols', 'cols4', 'cols_c32', "
                             "'cols_h', 'cols2_c16_h')")
    elif name in ("attention", "attention_rows") and LANES_VARIANT.fullmatch(value):
        unroll = LANES_VARIANT.fullmatch(value).group(2)
        if unroll is not None and int(unroll) not in (1, 2, 4, 8):
            raise ValueError(f"KernelOptions.{name} = {value!r}: rows loaded at once "
                             "(_uUNROLL) must be 1, 2, 4 or 8")
    elif name in ("attention", "attention_rows") and TILE_VARIANT.fullmatch(value):
        return
    elif value not in CHOICES[name]:
        lanes = ", 'lanes[1][_uUNROLL]', 'tile[_tROWS]' (ROWS 32, 64, 128 or 256)"
        extra = {"q4_gemv": f", {Q4_FORMS}", "attention": lanes,
                 "attention_rows": lanes}.get(name, "")
        raise ValueError(f"KernelOptions.{name} = {value!r}; accepted: None, "
                         f"{', '.join(map(repr, CHOICES[name]))}{extra}")
