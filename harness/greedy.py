"""Greedy decoding of a model statebench did not write on one backend, the prompt fed one
token per dispatch (the stateful way): what `statebench generate` prints and `run
--expect-tokens` checks; the command modules only parse their flags."""

from __future__ import annotations

from backends.base import registry
from backends.webnn.onnx_converter import ConversionError
from harness.logits import argmax
from harness.model_run import UserModel, backend_for, position_limit
from model.errors import UserError


def _vocabulary(proto) -> int | None:
    """The width of the graph's ``logits`` output, where it is a number."""
    out = next((o for o in proto.graph.output if o.name == "logits"), None)
    dims = out.type.tensor_type.shape.dim if out is not None else []
    return int(dims[-1].dim_value) if dims and dims[-1].HasField("dim_value") else None


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
            tokens.append(int(argmax(logits)))
            if len(tokens) < max_new_tokens:
                logits = b.step(tokens[-1])
        return tokens
    except Exception as exc:  # noqa: BLE001 - the runtime's own reason, in one line
        raise UserError(f"{backend} failed on {path} at position {b.position}: "
                        f"{' '.join(str(exc).split())}") from None
    finally:
        b.close()
