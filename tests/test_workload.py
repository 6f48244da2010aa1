"""Presets and their suffixes, cache specs by data type."""

from __future__ import annotations

import pytest

from model.errors import UserError
from model.workload import PRESETS, cache_specs, config_key, preset, valid_cache_bytes


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
    """Adding the kv_cache field must not move existing weight and graph caches; the
    float16-cache model gets a key of its own."""
    assert config_key(PRESETS["tiny"], 0) == "tiny-c5da0ad110-s0"
    assert config_key(preset("tiny+f16kv"), 0) != config_key(PRESETS["tiny"], 0)
