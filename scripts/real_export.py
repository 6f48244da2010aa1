"""Full-size real exports for the GPU box (issue 30 item 1): a randomly initialised Hugging Face
model with a published configuration, exported by onnxruntime-genai's builder, offline.

    python scripts/real_export.py --model llama-3.2-1b --work /tmp/real \
        --export nograph:int4:webgpu --export graph:int4:webgpu:enable_webgpu_graph=true

writes WORK/src/MODEL (config.json, safetensors, a tokenizer) once and each export to
WORK/MODEL-NAME/ (model.onnx, model.onnx.data, genai_config.json, ...); an export whose
genai_config.json is already there is kept. Needs torch, transformers, onnx, onnx_ir and
onnxruntime-genai (its builder); no network: the builder insists on a tokenizer
(`AutoTokenizer.from_pretrained` on the source folder), so a word-level one over t0..t{V-1}
is written beside the weights. The configurations are written here, not downloaded; the
weights are drawn from a fixed seed, so two runs export the same model.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # harness, as the repo's

from harness.speculative.e2e_render import parted_at_near_tie, passed  # noqa: E402

SEED = 0
#: Llama-3.2-1B's published configuration (its config.json), weights left to the seed
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
    "max_position_embeddings": 131072, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
    "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
}
#: the same architecture at test size (the script's own test on a CPU: llama3 rope kept)
LLAMA_TINY = {**LLAMA_3_2_1B, "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 176,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "max_position_embeddings": 4096, "bos_token_id": 1,
              "eos_token_id": 2,
              "rope_scaling": {**LLAMA_3_2_1B["rope_scaling"],
                               "original_max_position_embeddings": 256}}
#: a Qwen3.5 hybrid (gated-delta linear attention, one full-attention layer in four) at the
#: `hybrid-1b` preset's shapes (model/workload.py), about 1.2 B parameters: no published
#: Qwen3.5 of that size is written here, so the preset's widths stand in for one, and the
#: export and the preset compare as llama-3.2-1b and llama-1b do. The builder takes Qwen3.5
#: as its ConditionalGeneration model (it exports the text decoder; the vision tower here is
#: the smallest the config allows)
QWEN35_TEXT = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 4,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32,
    "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0,
                        "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                        "mrope_interleaved": True},
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "initializer_range": 0.02,
}
QWEN35_HYBRID_1B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "text_config": QWEN35_TEXT, "tie_word_embeddings": True,
    "vision_config": {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 2048, "num_position_embeddings": 16, "patch_size": 4,
                      "temporal_patch_size": 2, "spatial_merge_size": 2},
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "torch_dtype": "bfloat16",
}
#: the same architecture at test size (the script's own test on a CPU)
QWEN35_TINY = {
    **QWEN35_HYBRID_1B,
    "text_config": {**QWEN35_TEXT, "vocab_size": 1000, "hidden_size": 64,
                    "intermediate_size": 176, "num_hidden_layers": 4, "num_attention_heads": 4,
                    "head_dim": 32, "layer_types": ["linear_attention", "full_attention"] * 2,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                    "max_position_embeddings": 4096,
                    "rope_parameters": {**QWEN35_TEXT["rope_parameters"],
                                        "mrope_section": [2, 1, 1]}},
    "vision_config": {**QWEN35_HYBRID_1B["vision_config"], "out_hidden_size": 64},
    "image_token_id": 990, "video_token_id": 991, "vision_start_token_id": 992,
    "vision_end_token_id": 993,
}
#: test size with hybrid-1b's layer pattern (three gated-delta layers to one attention
#: layer, twice) and an MLP width of whole 4-bit blocks: a step's launches per period of
#: four layers compare with the hybrid-1b(+q4f16) preset's (scripts/launch_census.py)
#: without the full-size export
QWEN35_TINY_3TO1 = {
    **QWEN35_TINY,
    "text_config": {**QWEN35_TINY["text_config"], "intermediate_size": 192,
                    "num_hidden_layers": 8,
                    "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2},
}
MODELS = {"llama-3.2-1b": LLAMA_3_2_1B, "llama-tiny": LLAMA_TINY,
          "qwen3.5-hybrid-1b": QWEN35_HYBRID_1B, "qwen3.5-tiny": QWEN35_TINY,
          "qwen3.5-tiny-3to1": QWEN35_TINY_3TO1}


def log(msg: str) -> None:
    print(f"[real_export {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_tokenizer(vocab: int, bos: int, eos: int, folder: Path) -> None:
    """A word-level tokenizer over t0..t{vocab-1} (the builder loads one; nothing reads its
    words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0",
                                   bos_token=f"t{bos}", eos_token=f"t{eos}")
    fast.save_pretrained(folder)


def source_model(name: str, work: Path) -> Path:
    """The randomly initialised model ``name`` saved under WORK/src/NAME (once)."""
    import torch
    import transformers

    folder = work / "src" / name
    if (folder / "config.json").is_file() and list(folder.glob("*.safetensors")):
        log(f"source {folder} already there")
        return folder
    spec = dict(MODELS[name])
    dtype = getattr(torch, spec.pop("torch_dtype"))
    arch = spec["architectures"][0]
    config = transformers.AutoConfig.for_model(spec.pop("model_type"), **spec)
    torch.manual_seed(SEED)
    t0 = time.time()
    with torch.device("cpu"):
        model = getattr(transformers, arch)(config).to(dtype).eval()
    log(f"built {name}: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B parameters "
        f"({time.time() - t0:.0f} s)")
    model.save_pretrained(folder, safe_serialization=True)
    text = config.get_text_config()
    write_tokenizer(text.vocab_size, text.bos_token_id, text.eos_token_id, folder)
    log(f"saved {folder} ({time.time() - t0:.0f} s)")
    return folder


def export(src: Path, out: Path, precision: str, ep: str, extra: list[str], cache: Path) -> None:
    """onnxruntime-genai's builder on ``src`` into ``out`` (skipped where it is there)."""
    if (out / "genai_config.json").is_file() and (out / "model.onnx").is_file():
        log(f"export {out} already there")
        return
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src),
           "-o", str(out), "-p", precision, "-e", ep, "-c", str(cache)]
    if extra:
        cmd += ["--extra_options", *extra]
    log("+ " + " ".join(cmd))
    t0 = time.time()
    subprocess.run(cmd, check=True)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    log(f"exported {out} in {time.time() - t0:.0f} s ({size / 1e6:.0f} MB)")


def summary_lines(path: Path) -> list[str]:
    """One line a point of the results file ``path``: median step (and GPU) time, the
    match, and genai's loop where it ran (graph capture, its own greedy steps)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path.name}: not readable ({exc})"]
    points = data.get("points", []) if isinstance(data, dict) else []  # a manifest: none
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("statebench-spec/"):
        return [spec_line(path, pt) for pt in points]
    lines = []
    for pt in points:
        head = f"{path.stem:>16} {pt['backend']:<20} d{pt['context']:<6}"
        if pt["status"] != "ok":
            lines.append(f"{head} {pt['status']}: {(pt.get('reason') or '')[:110]}")
            continue
        gpu = (pt.get("gpu_ms") or {}).get("median")
        match = pt.get("match") or {}
        cell = f"{pt['step_ms']['median']:8.3f} ms" + (f" (GPU {gpu:.3f})" if gpu else "")
        cell += f"  match {'ok' if match.get('ok') else 'NO'} {match.get('max_rel', 0):.1e}"
        loop = (pt.get("details") or {}).get("genai")
        if loop:
            greedy, forced = loop.get("greedy_steps", 0), loop.get("forced_steps", 0)
            cell += (f"  capture {'on' if loop.get('graph_capture') else 'off'}, greedy "
                     f"{greedy}/{greedy + forced}")
        lines.append(f"{head} {cell}")
    return lines


def spec_line(path: Path, pt: dict) -> str:
    """One point of a speculative loop's file: ms a generated token, the verify over the
    one-token step, and whether tokens, logits and state passed."""
    head = f"{path.stem:>16} {pt['backend']:<20} d{pt.get('depth')} K={pt.get('k')} {pt.get('acceptance')}"
    if pt.get("status") != "ok":
        return f"{head} {pt.get('status')}: {(pt.get('reason') or '')[:110]}"
    verdict = "CHECK FAILED"
    if passed(pt):  # the table's verdict (a logits check not made where ids were read)
        verdict = (f"ok (parted at a near-tie at token {pt['near_tie']['at']})"
                   if parted_at_near_tie(pt) else "ok")
    return (f"{head} {pt['ms_per_token']:.3f} ms/token ({pt['speedup']:.2f}x), verify "
            f"{pt['verify_ms']['median']:.3f} ms ({pt['verify_over_plain']:.2f}x step) "
            f"{verdict}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3.2-1b")
    p.add_argument("--work", type=Path)
    p.add_argument("--export", action="append", default=[],
                   help="NAME:PRECISION:EP[:KEY=VALUE,...] (builder -p, -e, --extra_options)")
    p.add_argument("--summary", nargs="*", type=Path,
                   help="print one line a point of these results files, and nothing else")
    args = p.parse_args(argv)
    if args.summary is not None:
        for f in args.summary:
            if f.is_file() and (lines := summary_lines(f)):
                print("\n".join(lines))
        return 0
    if args.work is None:
        p.error("--work is required")
    args.work.mkdir(parents=True, exist_ok=True)
    src = source_model(args.model, args.work)
    for spec in args.export:
        parts = spec.split(":")
        if len(parts) not in (3, 4):
            p.error(f"--export {spec!r}: NAME:PRECISION:EP[:KEY=VALUE,...]")
        name, precision, ep = parts[:3]
        extra = parts[3].split(",") if len(parts) == 4 and parts[3] else []
        export(src, args.work / f"{args.model}-{name}", precision, ep, extra,
               args.work / "builder-cache")
    manifest = {"model": args.model, "seed": SEED, "config": MODELS[args.model],
                "exports": args.export}
    (args.work / f"{args.model}.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
