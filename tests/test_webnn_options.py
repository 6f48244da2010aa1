"""wgpu_impl/options.py: KernelOptions accepts every documented value of each knob, refuses
anything else with one clear error naming the knob, parses the A/B scripts' ``key=value``,
and is frozen (a context keeps the options it was created with)."""

from __future__ import annotations

import dataclasses

import pytest

from backends.webnn.wgpu_impl.options import KernelOptions

#: every knob and the values its documentation names (None: per adapter)
ACCEPTED = {
    "gemv": ["legacy", "cols", "cols2", "cols4g8", "rows", "rows_sh", "rows16", "rows_u8",
             "rows16_sh_u2", "rows_u8_w"],
    "attention": ["flash", "flash1", "lanes", "lanes1", "lanes_u8", "lanes1_u2", "unfused",
                  "generic"],
    "attention_rows": ["flash", "flash1", "lanes", "lanes1_u2", "unfused", "generic"],
    "gemv_prologue": ["launch", "off", "full", "vector"],
    "q4_prologue": ["off", "vector", "full"],
    "q4_epilogue": ["off", "gated"],
    "q4_norms": ["partials", "shared", "off"],
    "gemv_epilogue": ["off", "gated"],
    "gemv_norms": ["partials", "off"],
    "row_vector": ["unrolled", "loop"],
    "row_writes": ["separate"],
    "attention_writes": ["fold", "off"],
    "tile_pv": ["lanes", "walk"],
    "attention_loads": ["scores", "first", "kv"],
    "attention_sync": ["subgroups", "trees"],
    "attention_combine": ["launch", "product", "last"],
    "attention_splits": [1, 8, 64],
    "attention_q_rows": [1, 4, 16],
    "record_ahead": ["on", "pieces", "off"],
    "cache_copy": ["vec4", "identity", "buffer"],
    "gemv_weights": ["f32", "f16"],
    "gdn": ["generic", "fused", "fused8", "fused1_sh", "fused_norms", "fused256_sh_norms",
            "fused_cols", "fused_cols16"],
    "gdn_replay": ["fused", "launch"],
    "f16_loads": ["wide", "vec4"],
    "read_copy": ["dispatch", "separate", "separate_sync"],
    "q4_gemv": ["fused", "generic", "multi", "multi8", "multi2_l8", "multi4_l16_g4_u2", "multi_u4",
                "multi_h", "multi2_u2_h", "wide", "wide2", "wide4_k2", "wide_h", "wide2_k4_h",
                "quad", "quad_k2", "quad_h", "quad_k4_h", "quad_i8", "quad_k4_i8"],
    "pass_calls": ["direct", "wgpu-py"],
    "map_wait": ["spin", "caller", "thread"],
    "queue_calls": ["direct", "direct_maps", "wgpu-py"],
    "q4_rows": ["rows", "cols", "cols2", "cols4", "cols_c8", "cols4_c32", "quad", "cols_h",
                "cols2_h", "cols4_c16_h"],
}
REFUSED = {
    "gemv": ["fastest", "col", "rows_x"], "attention": ["flash2", "", "lanes_u3", "lanes2"],
    "attention_rows": ["flash2", "", "lanes_u3"],
    "gemv_prologue": ["on"], "q4_prologue": ["launch", ""],
    "q4_epilogue": ["on", "swiglu", ""], "q4_norms": ["on", "launch", ""],
    "gemv_epilogue": ["on", "swiglu", ""], "gemv_norms": ["on", "launch", ""],
    "row_vector": ["unroll", ""],
    "row_writes": ["one"], "attention_writes": ["on", "attention", ""],
    "tile_pv": ["lane", "walks", ""],
    "attention_loads": ["early", "score", ""],
    "attention_sync": ["subgroup", "tree", ""],
    "attention_combine": ["o", "products", ""],
    "attention_splits": [0, -2, "4", 2.0, True],
    "attention_q_rows": [0, -1, "4", 4.0, False],
    "record_ahead": ["yes"], "cache_copy": ["copy"], "gemv_weights": ["f64"],
    "gdn": ["fastest", "fused12", "fused0", "fused512", "fused_cols3", "fused_cols512"],
    "gdn_replay": ["on", "replay", ""],
    "f16_loads": ["u32"],
    "read_copy": ["sync"],
    "q4_gemv": ["dequantize", "", "multi0", "multi_l3", "multi8_l4", "multi_l32_g16", "multi_u5",
                "multi17_l32", "multi_hh", "wide0", "wide5", "wide_k0", "wide_k5", "wide_h2",
                "widest", "quad2", "quad_k0", "quad_k5", "quad_l8", "quad_i4", "quad_h_i8"],
    "pass_calls": ["raw", ""],
    "map_wait": ["poll", ""],
    "queue_calls": ["raw", ""],
    "q4_rows": ["quad4", "", "cols3", "cols_c4", "cols_c64", "rows2", "rows_h", "quad_h",
                "cols_h_c8", "cols_hh", "cols_h2"],
}


def test_every_knob_is_listed_here():
    assert [f.name for f in dataclasses.fields(KernelOptions)] == list(ACCEPTED) == list(REFUSED)


@pytest.mark.parametrize("knob", ACCEPTED)
def test_documented_values_are_accepted(knob):
    assert getattr(KernelOptions(), knob) is None
    for value in ACCEPTED[knob]:
        assert getattr(KernelOptions(**{knob: value}), knob) == value


@pytest.mark.parametrize("knob", REFUSED)
def test_other_values_are_refused_naming_the_knob(knob):
    for value in REFUSED[knob]:
        with pytest.raises(ValueError, match=f"{knob}"):
            KernelOptions(**{knob: value})
        with pytest.raises(ValueError, match=f"{knob}"):
            KernelOptions().replace(**{knob: value})


def test_parse_the_scripts_syntax():
    opts = KernelOptions.parse(["gemv=rows_sh", "attention_splits=16", "read_copy=separate"])
    assert (opts.gemv, opts.attention_splits, opts.read_copy) == ("rows_sh", 16, "separate")
    assert opts.attention is None
    # over a base; an empty value is None (the per-adapter choice)
    again = KernelOptions.parse(["gemv=", "gdn=fused8"], base=opts)
    assert (again.gemv, again.gdn, again.attention_splits) == (None, "fused8", 16)
    assert opts.gemv == "rows_sh"  # the base is unchanged
    for bad, words in (("nope=1", "unknown option 'nope'"), ("gemv", "KEY=VALUE"),
                       ("attention_splits=many", "attention_splits"), ("gdn=fused3", "gdn")):
        with pytest.raises(ValueError, match=words):
            KernelOptions.parse([bad])


def test_attention_rows_picks_the_attention_of_many_q_rows():
    """``attention_rows`` applies above ``MANY_Q_ROWS`` q rows a KV head (a K-token verify's
    16 on llama-1b), ``attention`` to the rest (a one-token step's 4)."""
    o = KernelOptions(attention_rows="lanes")
    assert (o.attention_for(4), o.attention_for(16)) == (None, "lanes")
    assert (o.attention_lanes(4), o.attention_lanes(16)) == (None, (False, None))
    assert KernelOptions(attention="lanes1").attention_for(16) == "lanes1"  # unset: as attention
    mixed = KernelOptions(attention="generic", attention_rows="lanes")
    assert mixed.attention_matched() and mixed.attention_matched(16)
    assert not mixed.attention_matched(4)  # the one-token step's stays on matmuls
    assert not KernelOptions(attention="generic").attention_matched()


def test_frozen_hashable_and_plain():
    opts = KernelOptions(gemv="rows", attention_splits=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.gemv = "cols"  # type: ignore[misc]
    assert opts == KernelOptions.parse(["gemv=rows", "attention_splits=8"])
    assert len({opts, KernelOptions(gemv="rows", attention_splits=8), KernelOptions()}) == 2
    plain = opts.as_dict()
    assert plain["gemv"] == "rows" and plain["attention_splits"] == 8 and len(plain) == len(ACCEPTED)
    assert KernelOptions(**plain) == opts


def test_a_context_compiles_with_the_options_it_was_created_with(ctx_with):
    """The options reach the compiler through the context (no global): a graph built on a
    context is planned under that context's options, and only a KernelOptions is taken."""
    from backends.webnn import MLGraphBuilder, ml

    c = ctx_with(read_copy="separate", gemv="rows_sh")
    assert c.options == KernelOptions(gemv="rows_sh", read_copy="separate")
    assert c.read_copy is False  # a context mode, read when the context is created
    b = MLGraphBuilder(c)
    x = b.input("x", data_type="float32", shape=[1, 4])
    g = b.build({"y": b.matmul(x, b.constant(data_type="float32", shape=[4, 3],
                                              value=[0.5] * 12))})
    assert g._plan.options is c.options
    (k,) = [la.kernel for la in g._plan.launches]
    assert k.name == "matmul_gemv" and "workgroupBarrier" in k.wgsl  # rows_sh: shared sums
    g.destroy()
    with pytest.raises(TypeError, match="KernelOptions"):
        ml.create_context(options={"gemv": "rows"})


def test_float16_products_only_where_the_adapter_has_them():
    """``_h`` variants: float16 products with 'shader-f16', else the same kernel without."""
    from backends.webnn.wgpu_impl.target import Target

    with_f16, without = Target(f16=True), Target()
    assert KernelOptions(q4_gemv="wide2_k2_h").q4_wide(with_f16) == (2, 2, True)
    assert KernelOptions(q4_gemv="wide2_k2_h").q4_wide(without) == (2, 2, False)
    assert KernelOptions(q4_gemv="wide").q4_wide(with_f16) == (1, 1, False)
    assert KernelOptions(q4_gemv="multi_h").q4_multi(with_f16) == (4, 32, None, 1, True)
    assert KernelOptions(q4_gemv="multi_h").q4_multi(without) == (4, 32, None, 1, False)
    assert KernelOptions(q4_gemv="multi").q4_wide(with_f16) is None
    assert KernelOptions(q4_gemv="wide").q4_multi(with_f16) is None
    assert KernelOptions(q4_gemv="quad_k2_h").q4_quad(with_f16) == (2, True)
    assert KernelOptions(q4_gemv="quad_k2_h").q4_quad(without) == (2, False)
    assert KernelOptions(q4_gemv="quad").q4_wide(with_f16) is None
    # "_i8": the int8 parts, not float16 products
    assert KernelOptions(q4_gemv="quad_k4_i8").q4_quad(with_f16) == (4, False)
    assert KernelOptions(q4_gemv="quad_k4_i8").q4_quad_ints(with_f16)
    assert not KernelOptions(q4_gemv="quad_k4_h").q4_quad_ints(with_f16)
    # several rows by column: the shape as without "_h", float16 products only with f16
    for value, cols in (("cols_h", (1, None)), ("cols2_c16_h", (2, 16)), ("cols4", (4, None))):
        opts = KernelOptions(q4_rows=value)
        assert opts.q4_cols(with_f16) == opts.q4_cols(without) == cols
        assert opts.q4_cols_half(with_f16) == value.endswith("_h")
        assert not opts.q4_cols_half(without)
    assert not KernelOptions(q4_rows="quad").q4_cols_half(with_f16)
    assert not KernelOptions().q4_cols_half(dataclasses.replace(with_f16, cpu=False))


def test_a_bad_q4_rows_value_is_one_line_naming_the_forms():
    """A mistyped ``q4_rows`` (an "_h" in the wrong place, on a variant without one) fails
    with one line naming the knob and the accepted forms, "_h" among them."""
    for bad in ("cols_h_c8", "quad_h", "rows_h"):
        with pytest.raises(ValueError) as err:
            KernelOptions.parse([f"q4_rows={bad}"])
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"KernelOptions.q4_rows = {bad!r}")
        assert "'cols[PER][_cCOLS][_h]'" in msg
