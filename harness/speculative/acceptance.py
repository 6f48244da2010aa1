"""How many drafts a verify should accept, and the scripted drafts that make it so
(docs/speculative.md).

A verify of a K-token graph feeds the newest token and K-1 drafts; m of the drafts are
accepted (0 .. K-1). The drafts are scripted from the target's own greedy continuation:
the first m are its greedy tokens, the next one a wrong token (where m < K-1), so a correct
backend accepts exactly m, and every m a run asks for is exercised on the real graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.errors import UserError

#: the named schedules (`--accept`); any other word must be a RATE in [0, 1]
NAMED = ("full", "partial", "zero")


@dataclass(frozen=True)
class Acceptance:
    """``full``: every draft accepted (m = K-1); ``zero``: none (the first draft wrong);
    ``partial``: m = 0, 1, .., K-1 in turn, verify after verify; a ``rate`` r: each draft
    right with probability r, independently (seeded), m the drafts before the first
    wrong one."""

    kind: str
    rate: float | None = None

    @property
    def label(self) -> str:
        return self.kind if self.rate is None else f"{self.rate:g}"

    @classmethod
    def parse(cls, text: str) -> Acceptance:
        word = str(text).strip()
        if word in NAMED:
            return cls(word)
        try:
            rate = float(word)
        except ValueError:
            rate = float("nan")
        if not 0 <= rate <= 1:  # nan fails too
            raise UserError(f"--accept {word!r}: accepted: {', '.join(NAMED)} or a RATE in "
                            "[0, 1] (each draft accepted with that probability)")
        return cls("rate", rate)

    def target(self, verify: int, k: int, rng: np.random.Generator) -> int:
        """m for the ``verify``-th verify (0-based) of a K-token graph."""
        drafts = k - 1
        if self.kind == "full":
            return drafts
        if self.kind == "zero":
            return 0
        if self.kind == "partial":
            return verify % (drafts + 1)
        right = rng.random(drafts) < self.rate
        return int(drafts if right.all() else np.argmin(right))


def parse_acceptances(text: str) -> list[Acceptance]:
    """``--accept full,0.7,zero`` → three schedules, in order, each once."""
    out: list[Acceptance] = []
    for part in (p for p in str(text).split(",") if p.strip()):
        a = Acceptance.parse(part)
        if a not in out:
            out.append(a)
    if not out:
        raise UserError(f"--accept is empty; accepted: {', '.join(NAMED)} or a RATE in [0, 1]")
    return out


def wrong_token(token: int, vocab: int) -> int:
    """A token that is not ``token`` (the draft where acceptance must stop)."""
    return (int(token) + 1) % vocab


class ScriptedDrafts:
    """Drafts from the greedy continuation ``greedy`` (g_1, g_2, ..: the tokens a
    non-speculative greedy decode generates after the prompt), ``acceptance`` deciding m
    per verify (seeded by ``seed``)."""

    def __init__(self, greedy: np.ndarray, acceptance: Acceptance, k: int, vocab: int,
                 seed: int = 0) -> None:
        self.greedy = np.asarray(greedy, np.int64).reshape(-1)
        self.acceptance, self.k, self.vocab = acceptance, k, vocab
        self.rng = np.random.default_rng([seed, k])
        self.verifies = 0

    def propose(self, generated: int) -> tuple[np.ndarray, int]:
        """(the K-1 drafts for the verify after ``generated`` tokens, the m they are made
        for): drafts i <= m are g_{generated+i}, draft m+1 a wrong token, the rest the
        greedy tokens after it (what a draft model that went astray might still say)."""
        m = self.acceptance.target(self.verifies, self.k, self.rng)
        self.verifies += 1
        drafts = self.greedy[generated:generated + self.k - 1].copy()
        if len(drafts) < self.k - 1:
            raise ValueError(f"the greedy continuation has {len(self.greedy)} tokens, too few "
                             f"for drafts after {generated}")
        if m < self.k - 1:
            drafts[m] = wrong_token(drafts[m], self.vocab)
        return drafts, m
