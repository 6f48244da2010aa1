"""`statebench generate MODEL --prompt 1,2,3 --max-new-tokens N --backend NAME`: greedy
decoding of a model statebench did not write, the prompt fed one token per dispatch (the
stateful way), so a user sees the model run on a backend and checks its tokens."""

from __future__ import annotations

import json

from harness.commands.base import Command
from harness.commands.common_args import add_model_argument
from model.errors import UserError


def parse_prompt(text: str, flag: str = "--prompt") -> list[int]:
    """``1,2,3`` -> [1, 2, 3] (the --prompt and --expect-tokens flags): non-negative token
    ids, at least one."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        raise UserError(f"{flag}: {text!r} is not a comma-separated list of token ids") from None
    if any(i < 0 for i in ids):
        raise UserError(f"{flag}: {text!r} has a negative token id")
    return ids


def token_diff(got: list[int], want: list[int]) -> str:
    """"" when the greedy tokens are the expected ones, else one line saying where they part."""
    if got == want:
        return ""
    at = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    return (f"tokens differ from --expect-tokens at new token {at}: got "
            f"{','.join(map(str, got))}, expected {','.join(map(str, want))}")


class Generate(Command):
    name = "generate"
    help = "greedy decoding of a model on one backend, the prompt fed one token per step"

    @classmethod
    def setup_arguments(cls, p) -> None:
        add_model_argument(p)
        p.add_argument("--prompt", required=True, help="token ids, comma-separated")
        p.add_argument("--max-new-tokens", type=int, default=None,
                       help="new tokens to decode (default 8, or as many as --expect-tokens)")
        p.add_argument("--backend", default="ort-cpu:copy")
        p.add_argument("--format", choices=("text", "json"), default="text")
        p.add_argument("--expect-tokens", default=None,
                       help="token ids the greedy decoding must give (e.g. the source model's); "
                            "exit 1 with a one-line diff where they differ")

    @classmethod
    def run_from_args(cls, args, console, err_console) -> int:
        prompt = parse_prompt(args.prompt)
        want = (parse_prompt(args.expect_tokens, "--expect-tokens")
                if args.expect_tokens is not None else None)
        if args.max_new_tokens is None:
            args.max_new_tokens = 8 if want is None else len(want)
        if args.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}")
        if want is not None and len(want) != args.max_new_tokens:
            raise UserError(f"--expect-tokens has {len(want)} tokens but --max-new-tokens is "
                            f"{args.max_new_tokens}")
        from harness.greedy import generate  # ONNX and the converter: only when it runs
        from harness.model_info import model_file

        tokens = generate(args.model, prompt, args.max_new_tokens, args.backend)
        if args.format == "json":
            text = json.dumps({"prompt": prompt, "tokens": tokens, "backend": args.backend})
        else:
            text = (f"model: {model_file(args.model)}\nbackend: {args.backend}\n"
                    f"tokens: {','.join(map(str, tokens))}")
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        diff = token_diff(tokens, want) if want is not None else ""
        if diff:
            err_console.print(f"statebench: {diff}", markup=False, highlight=False,
                              soft_wrap=True)
            return 1
        return 0
