"""What the end-to-end speculative tests share: tiny's shapes with attention layers only
(the KV rows' rollback by position alone, as llama-1b's; the presets small enough for
lavapipe are hybrids, run by tests/test_spec_e2e.py), the page classes, and a sweep config."""

from __future__ import annotations

from dataclasses import replace

from harness.speculative.acceptance import parse_acceptances
from harness.speculative.e2e_sweep import SpecConfig
from model.workload import ATTENTION, PRESETS, Workload
from tests.page_marks import PAGE_OK, PAGE_WHY, needs_page  # noqa: F401

#: tiny's head shapes, both layers attention: a real model (seeded weights, exported by
#: model.export, checked against the float64 reference), attention-only as llama-1b is
TINY_ATTENTION = replace(PRESETS["tiny"], name="tiny-attention", layers=(ATTENTION, ATTENTION))
WORKLOAD = Workload.build(TINY_ATTENTION)
PAGES = ("wgpu:stateless", "wgpu:reuse", "wgpu:stateful")




def config(backends: tuple[str, ...] = PAGES, ks: tuple[int, ...] = (4,),
           accept: str = "full,partial,zero", contexts: tuple[int, ...] = (8,),
           tokens: int = 12, read: str = "logits") -> SpecConfig:
    return SpecConfig(preset=TINY_ATTENTION.name, backends=list(backends), ks=list(ks),
                      acceptances=parse_acceptances(accept), contexts=list(contexts),
                      tokens=tokens, warmup=1, inprocess=True, read=read)


def pages() -> dict[str, type]:
    from backends.base import registry

    return {n: c for n, c in registry().items() if n in PAGES or n == "wgpu:fallback"}
