"""`statebench generate MODEL --prompt 1,2,3 --max-new-tokens N --backend NAME`: greedy
decoding of a model statebench did not write, the prompt fed one token per dispatch (the
stateful way), so a user sees the model run on a backend and checks its tokens."""

from __future__ import annotations

import json

import numpy as np

from backends.base import registry
from backends.webnn.onnx_converter import ConversionError
from harness.commands.base import Command
from harness.commands.common_args import add_model_argument
from harness.model_info import model_file
from harness.model_run import UserModel, backend_for, position_limit
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


def _vocabulary(proto) -> int | None:
    """The width of the graph's ``logits`` output, where it is a number."""
    out = next((o for o in proto.graph.output if o.name == "logits"), None)
    dims = out.type.tensor_type.shape.dim if out is not None else []
    return int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None


def token_diff(got: list[int], want: list[int]) -> str:
    """"" when the greedy tokens are the expected ones, else one line saying where they part."""
    if got == want:
        return ""
    at = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
    return (f"tokens differ from --expect-tokens at new token {at}: got "
            f"{','.join(map(str, got))}, expected {','.join(map(str, want))}")


def check_length(user: UserModel, prompt: int, new: int, new_flag: str = "--max-new-tokens") -> None:
    """Refuse, in one line and before any session, a decoding the model's positions cannot
    hold (its rotary cos/sin cache's rows, its position table, genai_config's
    context_length): ORT would fail at that step with its own error on stderr. The prompt
    takes positions 0..prompt-1 and every new token but the last one more step."""
    limit, why = position_limit(user.proto, user.path)
    last = prompt + new - 2
    if limit is None or last < limit:
        return
    room = (f"at most {limit - prompt + 1} new tokens after this prompt" if prompt <= limit
            else f"a prompt of at most {limit} tokens")
    raise UserError(f"{user.path}: --prompt ({prompt} tokens) and {new_flag} ({new}) reach "
                    f"position {last}, but the model has {limit} positions ({why}); ask for "
                    f"{room}")


def generate(model, prompt: list[int], max_new_tokens: int, backend: str,
             new_flag: str = "--max-new-tokens") -> list[int]:
    """The greedy tokens ``backend`` gives after ``prompt`` (``max_new_tokens`` of them);
    ``new_flag`` is the flag that asked for them (the refusals name it)."""
    backends = registry()
    if backend not in backends:
        raise UserError(f"unknown backend {backend!r}; accepted: {', '.join(sorted(backends))}")
    user = model if isinstance(model, UserModel) else UserModel.load(model)
    path, cls = user.path, backends[backend]
    vocab = _vocabulary(user.proto)
    if vocab is not None and max(prompt) >= vocab:
        raise UserError(f"--prompt: token id {max(prompt)} is beyond {path}'s vocabulary "
                        f"({vocab} logits)")
    check_length(user, len(prompt), max_new_tokens, new_flag)
    why = user.refusal(cls)
    if why:
        raise UserError(f"{backend} cannot run {path}: {why}")
    ok, why = cls.available()
    if not ok:
        raise UserError(f"{backend} is unavailable: {why}")
    b = backend_for(cls, path, user.hand_pairs)
    try:
        b.prepare(None, len(prompt) + max_new_tokens)
    except Exception as exc:  # noqa: BLE001 - a graph ORT will not load, or the builder refuses
        b.close()
        why = " ".join(str(exc).split())
        if not isinstance(exc, (RuntimeError, ConversionError, UserError)):  # not our words
            why = f"{backend} cannot run {path}: {type(exc).__name__}: {why}"
        raise UserError(why) from None
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
    except Exception as exc:  # noqa: BLE001 - the runtime's own reason, in one line
        raise UserError(f"{backend} failed on {path} at position {b.position}: "
                        f"{' '.join(str(exc).split())}") from None
    finally:
        b.close()


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
