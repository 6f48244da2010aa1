"""`statebench generate MODEL --prompt 1,2,3 --max-new-tokens N --backend NAME`: greedy
decoding of a model statebench did not write, the prompt fed one token per dispatch (the
stateful way), so a user sees the model run on a backend and checks its tokens."""

from __future__ import annotations

import json

import numpy as np

from backends.base import registry
from backends.webnn.onnx_converter import ConversionError, list_kv_pairs
from harness.commands.base import Command
from harness.commands.common_args import add_model_argument
from harness.model_info import load_model, model_file
from model.errors import UserError


def parse_prompt(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3] (the --prompt flag): non-negative token ids, at least one."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"--prompt: {text!r} is not a comma-separated list of token ids") from None
    if any(i < 0 for i in ids):
        raise UserError(f"--prompt: {text!r} has a negative token id")
    return ids


def generate(model, prompt: list[int], max_new_tokens: int, backend: str) -> list[int]:
    """The greedy tokens ``backend`` gives after ``prompt`` (``max_new_tokens`` of them)."""
    backends = registry()
    if backend not in backends:
        raise UserError(f"unknown backend {backend!r}; accepted: {', '.join(sorted(backends))}")
    path = model_file(model)
    try:
        list_kv_pairs(load_model(path))  # bad names and bad pairs: one line before any backend
    except ConversionError as exc:
        raise UserError(f"{path}: {exc}") from None
    cls = backends[backend]
    ok, why = cls.available()
    if not ok:
        raise UserError(f"{backend} is unavailable: {why}")
    b = cls(model=path) if backend.startswith("ort-") else cls(onnx_path=path)
    try:
        b.prepare(None, len(prompt) + max_new_tokens)
    except (RuntimeError, ConversionError, UserError) as exc:
        raise UserError(" ".join(str(exc).split())) from None
    try:
        logits = None
        for t in prompt:
            logits = b.step(t)
        tokens: list[int] = []
        for _ in range(max_new_tokens):
            tokens.append(int(np.argmax(logits)))
            if len(tokens) < max_new_tokens:
                logits = b.step(tokens[-1])
        return tokens
    finally:
        b.close()


class Generate(Command):
    name = "generate"
    help = "greedy decoding of a model on one backend, the prompt fed one token per step"

    @classmethod
    def setup_arguments(cls, p) -> None:
        add_model_argument(p)
        p.add_argument("--prompt", required=True, help="token ids, comma-separated")
        p.add_argument("--max-new-tokens", type=int, default=8)
        p.add_argument("--backend", default="ort-cpu:copy")
        p.add_argument("--format", choices=("text", "json"), default="text")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        if args.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
        prompt = parse_prompt(args.prompt)
        tokens = generate(args.model, prompt, args.max_new_tokens, args.backend)
        if args.format == "json":
            text = json.dumps({"prompt": prompt, "tokens": tokens, "backend": args.backend})
        else:
            text = (f"model: {model_file(args.model)}\nbackend: {args.backend}\n"
                    f"tokens: {','.join(map(str, tokens))}")
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        return 0
