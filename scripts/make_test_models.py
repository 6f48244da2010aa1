"""Build the tiny test decoders under tests/models/ with the real exporters.

Two randomly initialised Hugging Face models (fixed seeds, hidden 64, a vocabulary that no
projection width equals): a Llama and a Qwen3.5 hybrid (gated-delta linear-attention layers
beside full-attention layers, conv kernel 4). Each is exported by the onnxruntime-genai model
builder, optimum-cli and transformers' own OnnxExporter; the manifest records per export the
exporter and its version, the source config, a fixed prompt, the source model's greedy tokens
(float32 PyTorch) and the state pairs the exporter wrote, so the tests need no torch.

Torch, transformers and the exporters live in venvs outside the repository (docs/byom.md
gives the exact commands). optimum-onnx pins transformers<4.58, so it runs in a second venv:

    /work/venvs/exp-main/bin/python scripts/make_test_models.py --exporters genai,transformers
    /work/venvs/exp-optimum/bin/python scripts/make_test_models.py --exporters optimum

Each run rebuilds the source models from their seeds (the same weights in either venv: they
are saved once under --work and loaded from there) and merges its entries into the manifest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models"
MANIFEST = MODELS / "manifest.json"
PROMPT = [17, 401, 5, 923, 64]
NEW_TOKENS = 10
#: the largest source weight, about (int4-exact weights: scale * (q - 8))
AMPLITUDE = 0.25

#: source models: (architecture, seed, config). Widths: Llama q 64, kv 32, mlp 176, vocab 1000;
#: Qwen3.5 q 64 (x2 gated), kv 32, linear qkv 128, z 64, a/b 4, mlp 176, vocab 997.
SOURCES: dict[str, dict] = {
    "llama": {
        "seed": 1236,
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=1000, hidden_size=64,
                       intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "qwen35": {
        "seed": 4324,
        "architecture": "Qwen3_5ForConditionalGeneration",
        "config": dict(
            text_config=dict(
                initializer_range=0.1, vocab_size=997, hidden_size=64, intermediate_size=176,
                num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                layer_types=["linear_attention", "full_attention",
                             "linear_attention", "full_attention"],
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                     mrope_interleaved=True),
                bos_token_id=1, eos_token_id=2, pad_token_id=0),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, num_position_embeddings=16, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2),
            tie_word_embeddings=False, image_token_id=990, video_token_id=991,
            vision_start_token_id=992, vision_end_token_id=993),
    },
    # other seeds and sizes, for the pairing rules (a committed multi-token decode; the rest
    # made into a held-out set with --out): widths no other source has, eight-wide heads
    "llama-small": {
        "prompt": [17, 401, 5, 423, 64],
        "seed": 2027,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=500, hidden_size=32,
                       intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    # the builder's block_size options (docs/byom.md "Held-out exports"): weights every
    # block size from 16 to 128 keeps exactly, so the source's tokens stay the oracle
    "llama-blocks": {
        "prompt": [17, 401, 5, 923, 64],
        "seed": 1616,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "int4_blocks": (16, 128),
        "config": dict(initializer_range=0.1, vocab_size=1000, hidden_size=64,
                       intermediate_size=176, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "llama-wide": {
        "prompt": [17, 401, 5, 112, 64],
        "seed": 99,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=811, hidden_size=96,
                       intermediate_size=160, num_hidden_layers=3,
                       num_attention_heads=6, num_key_value_heads=3, head_dim=16,
                       max_position_embeddings=192, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "qwen35-small": {
        "prompt": [17, 401, 5, 310, 64],
        "seed": 5150,
        "family": "qwen35",
        "architecture": "Qwen3_5ForConditionalGeneration",
        "config": dict(
            text_config=dict(
                initializer_range=0.1, vocab_size=613, hidden_size=32, intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=3, linear_key_head_dim=8, linear_value_head_dim=8,
                linear_num_key_heads=2, linear_num_value_heads=6,
                max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     partial_rotary_factor=0.25, mrope_section=[1, 1, 0],
                                     mrope_interleaved=True),
                bos_token_id=1, eos_token_id=2, pad_token_id=0),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=32, num_position_embeddings=16, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2),
            tie_word_embeddings=False, image_token_id=606, video_token_id=607,
            vision_start_token_id=608, vision_end_token_id=609),
    },
    # the held-out set of issue 30 item 6 (made with --out, never committed): wider, deeper,
    # other head counts, tied embeddings, Qwen3.5 layer orders and rotary sections the
    # committed sources do not have (an empty mrope section: a 0-sized Slice and ScatterND)
    "llama-h128": {
        "prompt": [17, 401, 5, 623, 64],
        "seed": 31,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=733, hidden_size=128,
                       intermediate_size=224, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=160, rms_norm_eps=1e-5, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "qwen35-h96": {
        "prompt": [17, 401, 5, 510, 64],
        "seed": 777,
        "family": "qwen35",
        "architecture": "Qwen3_5ForConditionalGeneration",
        "config": dict(
            text_config=dict(
                initializer_range=0.1, vocab_size=701, hidden_size=96, intermediate_size=160,
                num_hidden_layers=3,
                num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                layer_types=["linear_attention", "linear_attention", "full_attention"],
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4,
                max_position_embeddings=160, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     partial_rotary_factor=0.5, mrope_section=[2, 2, 0],
                                     mrope_interleaved=True),
                bos_token_id=1, eos_token_id=2, pad_token_id=0),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=96, num_position_embeddings=16, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2),
            tie_word_embeddings=False, image_token_id=690, video_token_id=691,
            vision_start_token_id=692, vision_end_token_id=693),
    },
    "qwen35-h128": {
        "prompt": [17, 401, 5, 710, 64],
        "seed": 8128,
        "family": "qwen35",
        "architecture": "Qwen3_5ForConditionalGeneration",
        "config": dict(
            text_config=dict(
                initializer_range=0.1, vocab_size=907, hidden_size=128, intermediate_size=192,
                num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                layer_types=["full_attention", "linear_attention", "linear_attention",
                             "full_attention"],
                linear_conv_kernel_dim=3, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=4, linear_num_value_heads=8,
                max_position_embeddings=160, rms_norm_eps=1e-6, tie_word_embeddings=True,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                     partial_rotary_factor=0.25, mrope_section=[2, 1, 1],
                                     mrope_interleaved=True),
                bos_token_id=1, eos_token_id=2, pad_token_id=0),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=128, num_position_embeddings=16, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2),
            tie_word_embeddings=True, image_token_id=900, video_token_id=901,
            vision_start_token_id=902, vision_end_token_id=903),
    },
    # real models' head sizes (Llama-3.2-3B's 128; Qwen3.5's full attention, 256) on small
    # widths: the attention kernels' widest rows (docs/byom.md "Held-out exports")
    "llama-d128": {
        "prompt": [17, 401, 5, 223, 64],
        "seed": 4242,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=640, hidden_size=256,
                       intermediate_size=384, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                       max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "llama-d256": {
        "prompt": [17, 401, 5, 323, 64],
        "seed": 5353,
        "family": "llama",
        "architecture": "LlamaForCausalLM",
        "config": dict(initializer_range=0.1, vocab_size=520, hidden_size=128,
                       intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                       max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
    },
    "qwen35-d256": {
        "prompt": [17, 401, 5, 623, 64],
        "seed": 6161,
        "family": "qwen35",
        "architecture": "Qwen3_5ForConditionalGeneration",
        "config": dict(
            text_config=dict(
                initializer_range=0.1, vocab_size=733, hidden_size=128, intermediate_size=256,
                num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                layer_types=["linear_attention", "full_attention"],
                linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
                linear_num_key_heads=2, linear_num_value_heads=4,
                max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0,
                                     partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                                     mrope_interleaved=True),
                bos_token_id=1, eos_token_id=2, pad_token_id=0),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=128, num_position_embeddings=16, patch_size=4,
                               temporal_patch_size=2, spatial_merge_size=2),
            tie_word_embeddings=False, image_token_id=720, video_token_id=721,
            vision_start_token_id=722, vision_end_token_id=723),
    },
}


def prompt_for(name: str) -> list[int]:
    """The fixed prompt, its ids inside the source's vocabulary."""
    return SOURCES[name].get("prompt", PROMPT)


def family(name: str) -> str:
    """The source's architecture family ("llama" or "qwen35")."""
    return SOURCES[name].get("family", name)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=cwd)


def _tokenizer(vocab: int, folder: Path) -> None:
    """A word-level tokenizer over t0..t{vocab-1}: the genai builder insists on one."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    words.update({"<unk>": 3})
    tok = Tokenizer(models.WordLevel(vocab={k: v for k, v in words.items() if k != "t3"},
                                     unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="t1",
                                   eos_token="t2", pad_token="t0")
    fast.save_pretrained(folder)


def _int4_exact(shape, gen, block: int = 32, span: int = 32):
    """Random weights [out, in] that 4-bit block quantization (blocks of 32 along ``in``, as
    the genai builder's MatMulNBits) keeps exactly: each block is scale * (q - 8) with q in
    0..15 and both 0 and 15 present, so an int4 export computes what the source computes and
    the source's greedy tokens stay its oracle. ``block``, ``span`` (a source's
    ``int4_blocks``): both extremes in every ``block`` columns, one scale every ``span``, so
    every block size from ``block`` to ``span`` keeps them exactly (16, 128: the builder's
    block_size 16, 32, 64 and 128)."""
    import torch

    out, cols = shape
    q = (8.0 + 3.0 * torch.randn(out, cols, generator=gen)).round().clamp(0, 15)  # centred
    scale = torch.empty(out, cols)
    for start in range(0, cols, block):
        stop = min(start + block, cols)
        # the block's extremes at random places in each row (fixed places correlate the rows)
        where = start + torch.rand(out, stop - start, generator=gen).argsort(dim=1)[:, :2]
        q.scatter_(1, where[:, :1], 0.0)
        q.scatter_(1, where[:, 1:], 15.0)
        if start % span == 0:
            s = (0.5 + torch.rand(out, 1, generator=gen)) * (AMPLITUDE / 7)
        scale[:, start:stop] = s
    return scale * (q - 8.0)


def source_model(name: str, work: Path):
    """The float32 source model ``name``, built from its seed once and saved under ``work``."""
    import torch
    import transformers

    spec = SOURCES[name]
    folder = work / "src" / name
    cls = getattr(transformers, spec["architecture"])
    if not (folder / "config.json").is_file():
        cfg_cls = transformers.AutoConfig.for_model(
            "llama" if family(name) == "llama" else "qwen3_5").__class__
        config = cfg_cls(**spec["config"], architectures=[spec["architecture"]])
        torch.manual_seed(spec["seed"])
        model = cls(config).float().eval()
        # random init leaves norm weights at one (or zero, offset norms) and biases at zero:
        # perturb every 1-D parameter so an exporter's norm or gate handling is tested too
        with torch.no_grad():
            gen = torch.Generator().manual_seed(spec["seed"] + 1)
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.1)
                elif p.dim() == 2:
                    p.copy_(_int4_exact(p.shape, gen, *spec.get("int4_blocks", (32, 32))))
        model.save_pretrained(folder, safe_serialization=True)
        vocab = spec["config"].get("vocab_size") or spec["config"]["text_config"]["vocab_size"]
        _tokenizer(vocab, folder)
    model = cls.from_pretrained(folder, torch_dtype=torch.float32).eval()
    return model, folder


def greedy(model, prompt: list[int], n: int) -> tuple[list[int], float]:
    """The source model's greedy continuation, a manual loop over the full sequence (no cache,
    no generate() defaults to trust), float32; and the smallest top-1 minus top-2 logit gap on
    the way (how far a backend's logits may drift before a token flips)."""
    import torch

    ids, gaps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
            top = logits[0, -1].topk(2)
            gaps.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return ids[len(prompt):], min(gaps)


def _pairs(path: Path) -> list[dict]:
    """The state pairs as the exporter wrote them, read from the graph's interface: every
    input named like a cache with the output its exporter's scheme gives, the sequence axis
    where present is one longer (append) or none (overwrite). Independent of statebench."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    outs = {o.name: o for o in g.output}

    def dims(vi):  # transformers writes some fixed dims as numeric strings ("16")
        return [d.dim_value if d.HasField("dim_value") else
                int(d.dim_param) if d.dim_param.isdigit() else d.dim_param
                for d in vi.type.tensor_type.shape.dim]

    def partner(name: str) -> str | None:
        for a, b in (("past_key_values.", "present."), ("past.", "present."),
                     ("input.cache.", "output.cache.")):
            if name.startswith(a):
                return b + name[len(a):]
        return None

    found = []
    for vi in g.input:
        out = partner(vi.name)
        if out is None:
            continue
        if out not in outs:
            raise SystemExit(f"{path}: {vi.name} has no output {out}")
        a, b = dims(vi), dims(outs[out])
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        kind = "append" if diff else "overwrite"
        if len(diff) > 1:
            raise SystemExit(f"{path}: {vi.name} and {out} differ on axes {diff}")
        found.append({"input": vi.name, "output": out, "kind": kind,
                      "axis": diff[0] if diff else None})
    return found


def _single_file(path: Path) -> None:
    """Fold external data back into ``path`` (every export here is far below 2 GB)."""
    import onnx

    model = onnx.load(str(path))
    for f in list(path.parent.iterdir()):
        if f.name.startswith(path.name + ".data") or f.suffix == ".data":
            f.unlink()
    onnx.save(model, str(path), save_as_external_data=False)


#: int4 with float32 activations: the CPU EP's default (accuracy_level 4) quantizes the
#: activations to int8, and its logits drift from the source's by more than the greedy gap
INT4_OPTIONS = ["--extra_options", "accuracy_level=1"]


#: the builder's GatedDeltaNet export with compact state updates (a verify graph for
#: speculative decoding: ``state_update`` capsules, ``capture_count``, ``active``); the builder
#: allows GatedDeltaNet for the CUDA EP only
GDN_OPTIONS = ["--extra_options", "linear_attn_op=gated_delta_net", "use_paged_attention=true",
               "state_update_capacity=4"]


#: the builder's other options (docs/byom.md "Held-out exports"): exporter name -> (precision,
#: execution provider, extra options). Made into a held-out set with --out, never committed;
#: "accuracy_level" given here replaces INT4_OPTIONS' (one --extra_options list a call).
OPTION_VARIANTS: dict[str, tuple[str, str, list[str]]] = {
    "genai-q4f16-b16": ("int4", "webgpu", ["block_size=16"]),
    "genai-q4f16-b64": ("int4", "webgpu", ["block_size=64"]),
    "genai-q4f16-b128": ("int4", "webgpu", ["block_size=128"]),
    "genai-q4f16-wgraph": ("int4", "webgpu", ["enable_webgpu_graph=true"]),
    "genai-int4-acc4": ("int4", "cpu", ["accuracy_level=4"]),
    "genai-int4-asym": ("int4", "cpu", ["accuracy_level=1", "is_symmetric=false"]),
    "genai-int4-gather": ("int4", "cpu", ["accuracy_level=1", "op_types_to_quantize=MatMul/Gather"]),
    "genai-int4-shared": ("int4", "cpu", ["accuracy_level=1", "shared_embeddings=true"]),
    "genai-fp32-shared": ("fp32", "cpu", ["shared_embeddings=true"]),
    "genai-fp16": ("fp16", "webgpu", []),
    "genai-noembeds": ("fp32", "cpu", ["exclude_embeds=true"]),
}


def export_genai(name: str, src: Path, precision: str, out: Path, work: Path,
                 ep: str = "cpu", extra: list[str] | None = None) -> Path:
    """The builder's export for execution provider ``ep``: "cpu" (float32 activations;
    int4 at accuracy_level 1), "webgpu" (int4: float16 activations and caches,
    MatMulNBits at the builder's accuracy_level 4, what web pages ship as q4f16), or "cuda"
    with ``extra`` options (GDN_OPTIONS)."""
    cache = work / "genai-cache"
    if out.exists():
        shutil.rmtree(out)
    extra = [o for o in extra or [] if o != "--extra_options"]
    given = {o.split("=")[0] for o in extra}
    base = INT4_OPTIONS[1:] if precision == "int4" and ep == "cpu" else []
    options = [o for o in base if o.split("=")[0] not in given] + extra
    _run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src),
          "-o", str(out), "-p", precision, "-e", ep, "-c", str(cache),
          *(["--extra_options", *options] if options else [])])
    for f in out.iterdir():
        if f.name not in ("model.onnx", "model.onnx.data", "genai_config.json"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    if (out / "model.onnx.data").exists():
        _single_file(out / "model.onnx")
    return out


def export_optimum(name: str, src: Path, out: Path, work: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    tmp = work / "optimum-out" / name
    if tmp.exists():
        shutil.rmtree(tmp)
    _run([str(Path(sys.executable).with_name("optimum-cli")), "export", "onnx", "--model", str(src),
          "--task", "text-generation-with-past", str(tmp)])
    out.mkdir(parents=True)
    shutil.copy(tmp / "model.onnx", out / "model.onnx")
    if (tmp / "model.onnx_data").exists() or (tmp / "model.onnx.data").exists():
        for d in ("model.onnx_data", "model.onnx.data"):
            if (tmp / d).exists():
                shutil.copy(tmp / d, out / d)
        _single_file(out / "model.onnx")
        for d in ("model.onnx_data",):
            (out / d).unlink(missing_ok=True)
    return out / "model.onnx"


def text_only(model):
    """The text decoder of a Qwen3.5 ConditionalGeneration model as a Qwen3_5ForCausalLM with
    the same weights (what a text-only user exports; the vision tower only slows the export)."""
    import transformers

    if not hasattr(model.model, "language_model"):
        return model
    text = transformers.Qwen3_5ForCausalLM(model.config.text_config).float().eval()
    state = {f"model.{k}": v for k, v in model.model.language_model.state_dict().items()}
    state["lm_head.weight"] = model.lm_head.weight
    text.load_state_dict(state, strict=True)
    return text


def export_transformers(name: str, model, out: Path, tokens: list[int],
                        multimodal: bool = False, multi_token: bool = False) -> Path:
    """decode.onnx of ``export_for_generation``: of the text decoder, or (``multimodal``) of
    the whole ConditionalGeneration model, whose decode takes position_ids [4, 1, 1] (a text
    row and the three rotary sections); that export takes minutes longer. ``multi_token``:
    ``multi_token_decode=True``, a decode of any number of new tokens (input_ids [1, s70],
    the caches [.., s53, ..] -> [.., s53 + s70, ..]: what a K-token verify runs)."""
    import torch
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    if not multimodal:
        model = text_only(model)
        if greedy(model, prompt_for(name), NEW_TOKENS)[0] != tokens:
            raise SystemExit(f"{name}: the text-only model does not give the source's tokens")
    if out.exists():
        shutil.rmtree(out)
    ids = torch.tensor([prompt_for(name)])
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    exported = OnnxExporter().export_for_generation(model, inputs, OnnxConfig(dynamic=True),
                                                    multi_token_decode=multi_token)
    exported.save_pretrained(out)
    for f in out.iterdir():
        if f.name not in ("decode.onnx", "decode.onnx.data"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    if (out / "decode.onnx.data").exists():
        _single_file(out / "decode.onnx")
    return out / "decode.onnx"


def _entry(name: str, exporter: str, pkg: str, model_name: str, file: Path, config: dict,
           tokens: list[int]) -> dict:
    return {
        "name": name,
        "exporter": exporter,
        "exporter_version": version(pkg),
        "transformers_version": version("transformers"),
        "source": {"model": family(model_name), "variant": model_name,
                   "architecture": SOURCES[model_name]["architecture"],
                   "seed": SOURCES[model_name]["seed"], "config": config},
        "path": str(file.relative_to(MODELS)),
        "size_bytes": sum(f.stat().st_size for f in (file if file.is_dir() else file.parent).iterdir()),
        "prompt": prompt_for(model_name),
        "greedy_tokens": tokens,
        "pairs": _pairs(file / "model.onnx" if file.is_dir() else file),
    }


def _set_out(folder: Path) -> None:
    global MODELS, MANIFEST
    MODELS, MANIFEST = folder.resolve(), folder.resolve() / "manifest.json"


def _merge(entries: list[dict]) -> None:
    old = json.loads(MANIFEST.read_text())["models"] if MANIFEST.exists() else []
    names = {e["name"] for e in entries}
    models = sorted([e for e in old if e["name"] not in names] + entries, key=lambda e: e["name"])
    MANIFEST.write_text(json.dumps({"models": models}, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exporters", default="genai,transformers",
                    help="comma list of genai, genai-int4, genai-q4f16, genai-gdn (GatedDeltaNet with "
                    "state_update_capacity 4), transformers, transformers-mm "
                    "(Qwen3.5's whole ConditionalGeneration model), transformers-mtd "
                    "(multi_token_decode=True), optimum, and the builder's option variants "
                    + ", ".join(OPTION_VARIANTS))
    ap.add_argument("--models", default="llama,qwen35", help=f"comma list of {', '.join(SOURCES)}")
    ap.add_argument("--work", type=Path, default=Path("/tmp/statebench-test-models"))
    ap.add_argument("--out", type=Path, default=MODELS,
                    help="where the exports and manifest.json go (a held-out set: elsewhere)")
    args = ap.parse_args()
    _set_out(args.out)
    MODELS.mkdir(parents=True, exist_ok=True)
    entries = []
    failures = []
    for model_name in args.models.split(","):
        try:
            model, src = source_model(model_name, args.work)
        except (AttributeError, ImportError, ValueError) as exc:  # this venv's transformers lacks it
            failures.append(f"{model_name}: no source model here ({exc})")
            continue
        tokens, gap = greedy(model, prompt_for(model_name), NEW_TOKENS)
        config = json.loads((src / "config.json").read_text())
        print(f"{model_name}: greedy {tokens}, smallest gap {gap:.4f}", flush=True)
        for exporter in args.exporters.split(","):
            name = f"{exporter}-{model_name}"
            try:
                if exporter == "genai":
                    file = export_genai(model_name, src, "fp32", MODELS / name, args.work)
                    entries.append(_entry(name, "onnxruntime-genai builder -p fp32 -e cpu",
                                          "onnxruntime-genai", model_name, file, config, tokens))
                elif exporter == "genai-int4":
                    file = export_genai(model_name, src, "int4", MODELS / name, args.work)
                    entries.append(_entry(name, "onnxruntime-genai builder -p int4 -e cpu "
                                          + " ".join(INT4_OPTIONS),
                                          "onnxruntime-genai", model_name, file, config, tokens))
                elif exporter == "genai-q4f16":
                    file = export_genai(model_name, src, "int4", MODELS / name, args.work,
                                        ep="webgpu")
                    entries.append(_entry(name, "onnxruntime-genai builder -p int4 -e webgpu",
                                          "onnxruntime-genai", model_name, file, config, tokens))
                elif exporter in OPTION_VARIANTS:
                    precision, ep, extra = OPTION_VARIANTS[exporter]
                    if "shared_embeddings=true" in extra and not config.get(
                            "tie_word_embeddings", False):
                        continue  # the builder shares only what the source ties
                    file = export_genai(model_name, src, precision, MODELS / name, args.work,
                                        ep=ep, extra=extra)
                    entries.append(_entry(name, f"onnxruntime-genai builder -p {precision} "
                                          f"-e {ep}" + (f" --extra_options {' '.join(extra)}"
                                                        if extra else ""),
                                          "onnxruntime-genai", model_name, file, config, tokens))
                elif exporter == "genai-gdn":
                    if family(model_name) != "qwen35":
                        continue  # a GatedDeltaNet export needs linear-attention layers
                    file = export_genai(model_name, src, "fp16", MODELS / name, args.work,
                                        ep="cuda", extra=GDN_OPTIONS)
                    entries.append(_entry(name, "onnxruntime-genai builder -p fp16 -e cuda "
                                          + " ".join(GDN_OPTIONS),
                                          "onnxruntime-genai", model_name, file, config, tokens))
                elif exporter == "optimum":
                    file = export_optimum(model_name, src, MODELS / name, args.work)
                    entries.append(_entry(name, "optimum-cli export onnx", "optimum-onnx",
                                          model_name, file, config, tokens))
                elif exporter == "transformers-mtd":
                    file = export_transformers(model_name, model, MODELS / name, tokens,
                                               multi_token=True)
                    entries.append(_entry(name, "transformers OnnxExporter "
                                          "(multi_token_decode=True)", "transformers", model_name,
                                          file, config, tokens))
                elif exporter == "transformers-mm":
                    if family(model_name) != "qwen35":
                        continue  # only the hybrid's source is a multimodal model
                    file = export_transformers(model_name, model, MODELS / name, tokens,
                                               multimodal=True)
                    entries.append(_entry(name, "transformers OnnxExporter (multimodal)",
                                          "transformers", model_name, file, config, tokens))
                elif exporter == "transformers":
                    file = export_transformers(model_name, model, MODELS / name, tokens)
                    entries.append(_entry(name, "transformers OnnxExporter", "transformers",
                                          model_name, file, config, tokens))
                else:
                    raise SystemExit(f"unknown exporter {exporter!r}")
                _merge(entries[-1:])
            except Exception as exc:  # noqa: BLE001 - one exporter's failure, the rest go on
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
                print(f"FAILED {name}: {exc}", flush=True)
    for f in failures:
        print("failed:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
