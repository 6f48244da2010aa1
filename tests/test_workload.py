"""Presets and their suffixes, cache specs by data type."""

from __future__ import annotations

import numpy as np
import pytest

from model.errors import UserError
from model.workload import (
    K_MAJOR,
    PRESETS,
    cache_specs,
    config_key,
    in_layout,
    preset,
    quantised_names,
    valid_cache_bytes,
    weight_shapes,
)


@pytest.mark.parametrize("name,weights,kv", [
    ("tiny", "float32", "float32"), ("tiny+f16", "float16", "float32"),
    ("tiny+f16kv", "float32", "float16"), ("tiny+f16+f16kv", "float16", "float16"),
    ("tiny+f16kv+f16", "float16", "float16")])
def test_suffixes_compose(name, weights, kv):
    cfg = preset(name)
    assert (cfg.name, cfg.weights, cfg.kv_cache) == (name, weights, kv)
    for s in cache_specs(cfg, 8):
        assert s.dtype == (kv if s.kind == "append" else "float32")


@pytest.mark.parametrize("bad", ["tiny+f8", "tiny+f16kv+f16kv", "huge+f16kv", "+f16kv", "tiny+"])
def test_bad_preset_names_say_what_is_accepted(bad):
    with pytest.raises(UserError, match="unknown preset.*'\\+f16kv' \\(float16 KV caches\\)"):
        preset(bad)


def test_f16kv_halves_the_kv_bytes_only():
    base, half = preset("small"), preset("small+f16kv")
    for a, b in zip(cache_specs(base, 64), cache_specs(half, 64), strict=True):
        assert b.nbytes * (2 if a.kind == "append" else 1) == a.nbytes
    kv32 = valid_cache_bytes(base, 10) - valid_cache_bytes(half, 10)
    assert kv32 * 2 == 2 * len(base.attention_layers) * base.kv_heads * 10 * base.head_dim * 4


def test_config_keys_of_float32_cache_models_are_unchanged():
    """Adding the kv_cache and gdn_conv_kernel fields must not move the caches of a model
    they do not change (a float32-cache model without GDN layers); the float16-cache model
    and the hybrids with a conv get keys of their own, so no graph exported without the
    conv is reused."""
    assert config_key(PRESETS["llama-1b"], 0) == "llama-1b-6d00524338-s0"
    assert config_key(PRESETS["tiny"], 0) != "tiny-c5da0ad110-s0"  # the key before the conv
    assert config_key(preset("tiny+f16kv"), 0) != config_key(PRESETS["tiny"], 0)


@pytest.mark.parametrize("name", ["tiny", "small", "hybrid-1b"])
def test_every_gdn_layer_carries_a_conv_window_before_its_state(name):
    """Qwen3.5's third kind of state: (1, conv_dim, kernel-1) per GDN layer, named as the
    recurrent state (so the past_state rule pairs it), float32, listed before it."""
    cfg = preset(name)
    conv_dim = 2 * cfg.gdn_qk_heads * cfg.gdn_qk_dim + cfg.gdn_v_heads * cfg.gdn_v_dim
    specs = {s.input: s for s in cache_specs(cfg, 8)}
    names = list(specs)
    for i in cfg.gdn_layers:
        conv = specs[f"past_conv_state.{i}"]
        assert (conv.output, conv.shape, conv.kind, conv.dtype) == (
            f"present_conv_state.{i}", (1, conv_dim, 3), "overwrite", "float32")
        assert names.index(conv.input) + 1 == names.index(f"past_state.{i}")
    assert len(specs) == 2 * len(cfg.attention_layers) + 2 * len(cfg.gdn_layers)


def test_the_k_major_layout_swaps_only_the_recurrent_state():
    cfg = preset("small")
    v, k = cache_specs(cfg, 8), cache_specs(cfg, 8, K_MAJOR)
    for a, b in zip(v, k, strict=True):
        if a.input.startswith("past_state."):
            assert b.shape == (*a.shape[:2], a.shape[3], a.shape[2])
            x = np.arange(np.prod(a.shape), dtype=np.float32).reshape(a.shape)
            assert np.array_equal(in_layout(b, x), x.transpose(0, 1, 3, 2))
        else:
            assert a == b
    with pytest.raises(ValueError, match="layout"):
        cache_specs(cfg, 8, "row-major")


def test_q4_keeps_the_conv_taps_float():
    cfg = preset("tiny+q4")
    assert "layers.0.conv1d" in weight_shapes(cfg)
    assert "layers.0.conv1d" not in quantised_names(cfg)
    assert "layers.0.q_proj" in quantised_names(cfg)
