"""The compiler's and context's knobs: kernel variants for benchmarks and tests, and how each
is resolved for an adapter when left to None."""

from __future__ import annotations

import re

from .target import Target

#: kernel-variant overrides for benchmarks and tests (None: chosen per adapter);
#: "attention": None/"flash" (two-launch decode attention where the pattern matches),
#: "unfused" (QK, chain, softmax, split-K probs·V), "generic" (plain matmuls)
#: "gemv_prologue": where a gemv's input vector reads a one-element reduction (RMSNorm):
#: None/"launch" (the vector and its reduction in one launch of their own), "off" (each
#: launched on its own), "full" (both computed by each gemv workgroup: measured slower on
#: the H200, PERFORMANCE.md), "vector" (the vector computed by each gemv workgroup, the
#: reduction launched)
#: "row_writes": None (scatters of one index tensor into same-shaped caches: one launch),
#: "separate"
#: "attention_splits": None (kernels/attention.SPLITS) or the splits per head flash-decoding
#: aims at on long caches
#: "cache_copy": how a non-stateful scatter copies the unchanged cache into its output:
#: None (float32 caches: a vec4 copy kernel, 256 invocations a workgroup; on the H200 it
#: took llama-1b's reuse step at 8192 from 4.97 to 2.72 ms of GPU time), "identity" (the
#: element-wise identity kernel, one value per invocation), "buffer" (copy_buffer_to_buffer:
#: splits the pass); FINDINGS 18
#: "gemv_weights": how constant weights of the GPU matrix-vector kernels are stored: None
#: (float16 where every value of the constant is a float16 value, so nothing is lost; else
#: float32), "f32", "f16" (always: lossy unless the weights are float16 values)
#: "gdn": one decode step of a gated delta net (decay, retrieval, delta, rank-1 update,
#: output matvec and its scale) where the pattern matches (wgpu_impl/match_gdn.py): None (one
#: launch on GPU adapters, the generic ops on CPU adapters), "generic" (the ops one by one),
#: "fused[LANES][_sh][_norms]" (the one launch on any adapter; LANES invocations per state
#: row, default 32; "_sh": sums through workgroup memory, not subgroupAdd; "_norms": q's
#: and k's L2 norms keep their own launches instead of being folded into the kernel)
#: "record_ahead": None (per adapter: GPUs on, CPU adapters off), "on" (a context records
#: each dispatch's successor while the device runs it: context._record_ahead; its command
#: buffers in one queue.submit), "pieces" (the same, submitted one by one), "off"
#: (every dispatch encodes its own); read when a context is created
#: "f16_loads": how flash-decoding loads a float16 KV cache: None/"wide" (16-byte
#: ``vec4<u32>`` loads of 8 halves, unpacked, where the head dimension is a multiple of 8;
#: else as "vec4"), "vec4" (``vec4<f16>`` loads of 4 halves, or ``f16`` when d % 4 != 0)
#: "read_copy": None ("dispatch": a dispatch's readable outputs are copied to staging at the
#: end of its last command buffer, so a read right after only maps: context._read_copy_for),
#: "separate" (each read copies in a submit of its own), "separate_sync" (the same, and each
#: map preceded by wgpu-py's empty submit, as before either change: staging.map_read); read
#: when a context is created
OPTIONS: dict[str, str | None] = {"gemv": None, "attention": None, "gemv_prologue": None,
                                  "row_writes": None, "attention_splits": None,
                                  "record_ahead": None, "cache_copy": None,
                                  "gemv_weights": None, "gdn": None, "f16_loads": None,
                                  "read_copy": None}


#: gemv_cols variants: (columns per invocation, workgroup size, workgroups; 0: all blocks)
COLS = {"cols": (8, 32, 8), "cols2": (2, 64, 0), "cols4": (4, 64, 0), "cols4g8": (4, 64, 8),
        "cols8g8": (8, 32, 8), "cols2g4": (2, 64, 4), "cols2g16": (2, 64, 16),
        "cols4g4": (4, 32, 4), "cols1g8": (1, 64, 8)}


#: gemv_rows variants: ``rows[LANES][_sh][_uDEPTH]`` (invocations per weight row, default 32;
#: ``_sh``: sums through workgroup memory, not subgroupAdd; vec4 loads in flight, default 4)
ROWS_VARIANT = re.compile(r"rows(\d+)?(_sh)?(?:_u(\d+))?")


def gemv_variant(t: Target, cols_ok: bool = True) -> str:
    """The matrix-vector kernel for this adapter (PERFORMANCE.md): one invocation per
    column on CPU adapters, ``lanes`` invocations per column with subgroup sums on GPUs."""
    v = OPTIONS.get("gemv") or ("cols" if t.cpu else "rows")
    if v.startswith("cols") and not cols_ok:
        v = "rows"
    return v


GDN_VARIANT = re.compile(r"fused(\d+)?(_sh)?(_norms)?")


def gdn_variant(t: Target) -> tuple[int, bool, bool] | None:
    """(lanes per state row, sums through workgroup memory, fold q's and k's L2 norms) of
    the gated delta kernel, or None for the generic ops (OPTIONS["gdn"]; by default the
    kernel on GPU adapters only, PERFORMANCE.md)."""
    how = OPTIONS.get("gdn")
    if how == "generic" or (how is None and t.cpu):
        return None
    m = GDN_VARIANT.fullmatch(how or "fused")
    if m is None:
        raise ValueError(f"OPTIONS['gdn'] = {how!r}; accepted: None, 'generic', "
                         "'fused[LANES][_sh][_norms]' (e.g. 'fused', 'fused8_sh')")
    lanes = int(m.group(1) or 32)
    if lanes < 1 or lanes > 256 or lanes & (lanes - 1):
        raise ValueError(f"OPTIONS['gdn'] = {how!r}: lanes per state row must be a power of "
                         "two from 1 to 256")
    return lanes, bool(m.group(2)), not m.group(3)


