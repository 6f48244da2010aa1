"""A sweep's defaults and its --contexts parsing, apart from the runner (``harness.runner``)
so that the commands' parsers are built without loading what a sweep runs (ONNX, the WebNN
compiler): ``statebench gate`` or ``--help`` start in a fraction of the time."""

from __future__ import annotations

from model.errors import UserError

WORKER_TIMEOUT_S = 1800.0
#: the default sweep's depths: the stateful cache is reached by dispatching every prefix token,
#: so on lavapipe (~50 ms a `small` step) these keep the default sweep near 2 minutes
DEFAULT_CONTEXTS = "64,256,512"
#: seconds of GPU load before each GPU point's warm-up steps (heater.heat)
DEFAULT_WARM_S = 2.0


def positive_list(text: str, flag: str, noun: str, example: str,
                  most: int | None = None) -> list[int]:
    """A comma list of positive integers (each at most ``most``) as ints, each once, in
    order; anything else is the user's error, naming ``flag`` and the bad ``noun``."""
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise UserError(f"bad {noun} {part!r} in {flag}; accepted: positive integers, "
                            f"comma-separated (e.g. {example})") from None
        if n <= 0 and most is None:
            raise UserError(f"bad {noun} {n} in {flag}; {noun}s must be positive integers")
        if most is not None and not 1 <= n <= most:
            raise UserError(f"bad {noun} {n} in {flag}; a {noun} is 1..{most} tokens")
        if n not in out:
            out.append(n)
    if not out:
        raise UserError(f"{flag} is empty; accepted: positive integers, comma-separated")
    return out


def parse_contexts(text: str) -> list[int]:
    """'64,256,1024' → [64, 256, 1024]; anything else is the user's error."""
    return positive_list(text, "--contexts", "context", "64,256,1024")
