"""The end-to-end speculative results as a rich table and note lines (renderables, never
printed here): a row per depth × K × acceptance, a column per backend, as `run`'s table."""

from __future__ import annotations

from rich.table import Table

from harness.speculative.spec_results import SpecResults, read_of

CAPTION = ("ms per generated token · speedup over the same page's one-token decode "
           "(/ over it chained on the device, where the page read ids)\n"
           "verify ms (× one-token step) · mean drafts accepted · rollback ms\n"
           "✓ tokens = greedy, logits and state as feeding only the accepted tokens "
           "(*: the state not read back; †: the page read ids, the logits not compared;\n"
           "≈: the tokens part at a near-tie both graphs' logits agree on, checked up to it)")


def logits_ok(p: dict) -> bool | None:
    """The logits check's verdict; None where it was not made (the page read ids, not
    logits): neither a pass nor a failure."""
    if read_of(p) == "ids" and p.get("logits_match_plain") is None:
        return None
    return bool(p.get("logits_match_plain"))


def parted_at_near_tie(p: dict) -> bool:
    """Whether the tokens part from the one-token decode's only at a certified near-tie
    (``loop.near_tie``): the checks then hold up to it."""
    tie = p.get("near_tie")
    return bool(not p.get("tokens_match_greedy") and tie and tie.get("certified"))


def passed(p: dict) -> bool:
    """Every check made passed: the tokens (equal, or parted at a certified near-tie), the
    state, the logits where they were read, and the chained one-token decode's ids where it
    ran."""
    tokens = p.get("tokens_match_greedy") or parted_at_near_tie(p)
    return bool(tokens and logits_ok(p) is not False
                and p.get("state_ok") and p.get("plain_chained_matches") is not False)


def mark(p: dict) -> str:
    """✗, or ✓ with * where the state was not read back and † where the logits were not
    (the page read ids): what the ✓ vouches for."""
    if not passed(p):
        return "✗"
    return ("✓" + ("" if p.get("state_compared", True) else "*")
            + ("†" if logits_ok(p) is None else "") + ("≈" if parted_at_near_tie(p) else ""))


def _cell(p: dict | None) -> str:
    if p is None:
        return ""
    if p["status"] != "ok":
        return f"[dim]{p['status']}[/]"
    m = mark(p)
    tick = f"[red]{m}[/]" if m == "✗" else f"[green]✓[/]{m[1:]}"
    rb = p["rollback"]["ms"]["median"]
    chained = p.get("speedup_vs_chained")
    over = "" if chained is None else f" / {chained:.2f}×"
    return (f"{p['ms_per_token']:.3f} · {p['speedup']:.2f}×{over}\n"
            f"{p['verify_ms']['median']:.3f} ({p['verify_over_plain']:.2f}×) · "
            f"{p['mean_accepted']:.2f} · {rb:.4f}\n{tick}")


def table(results: SpecResults) -> Table:
    w = results.workload
    t = Table(title=f"statebench speculative · {w.get('preset')} · {w.get('tokens')} tokens",
              show_lines=True, caption=CAPTION)
    for col in ("depth", "K", "accept"):
        t.add_column(col, justify="right", style="bold", no_wrap=True)
    backends = list(dict.fromkeys(p["backend"] for p in results.points))
    for b in backends:
        t.add_column(b, justify="right", no_wrap=True)
    rows = list(dict.fromkeys((p["depth"], p["k"], p["acceptance"]) for p in results.points))
    by = {(p["backend"], p["depth"], p["k"], p["acceptance"]): p for p in results.points}
    for depth, k, acc in rows:
        t.add_row(str(depth), str(k), acc, *[_cell(by.get((b, depth, k, acc))) for b in backends])
    return t


def notes(results: SpecResults) -> list[str]:
    """One line per point not measured (the reason, once per backend and reason) and per
    point that failed a check."""
    lines, seen = [], set()
    for p in results.points:
        where = f"{p['backend']} @ d{p['depth']} K={p['k']} {p['acceptance']}"
        if p["status"] != "ok":
            if (p["backend"], p["reason"]) not in seen:
                seen.add((p["backend"], p["reason"]))
                lines.append(f"{where}: {p['status']}: {p['reason']}")
            continue
        if parted_at_near_tie(p):
            t = p["near_tie"]
            lines.append(f"≈ {where}: the tokens part from the one-token decode's at token "
                         f"{t['at']}, a near-tie: its logits put the loop's {t['loop_token']} "
                         f"{t['gap']:.3g} below its {t['plain_token']}, the loop's the reverse "
                         f"by {t['loop_gap']:.3g}, both within the tolerance's {t['bound']:.3g};"
                         " tokens, logits and state checked up to there")
        elif not p["tokens_match_greedy"]:
            margin = p.get("greedy_margin_at_mismatch")
            lines.append(f"✗ {where}: tokens differ from the one-token decode's at token "
                         f"{p['first_mismatch']} (its top-2 logit margin there "
                         f"{'?' if margin is None else f'{margin:.3g}'})")
        if logits_ok(p) is None and "ids" not in seen:  # once: every such point is marked †
            seen.add("ids")
            lines.append(f"{where} (and every point marked †): the page read ids, not logits "
                         "(--read ids): the logits not compared; the tokens and the state were")
        if p.get("plain_chained_matches") is False:
            lines.append(f"✗ {where}: the chained one-token decode's ids differ from the "
                         "one-token decode's")
        why = p.get("plain_chained_why")
        if why and read_of(p) == "ids" and (p["backend"], "chain") not in seen:
            seen.add((p["backend"], "chain"))
            lines.append(f"{where}: no chained one-token decode: {why}")
        if logits_ok(p) is False:
            c = p["logits_check"]
            lines.append(f"✗ {where}: verify logits vs the one-token decode's: max rel "
                         f"{c['max_rel']} > {c['tolerance']} ({c['rows']} rows)")
        for name, c in p["state"].items():
            if name == "position" and not c["ok"]:
                lines.append(f"✗ {where}: the next write at {c['position']}, not at "
                             f"{c['expected']} (the depth + the tokens generated)")
            elif not c["ok"]:
                lines.append(f"✗ {where}: state {name}: {', '.join(c['differs'] + c['missing'])}"
                             f" differ (max rel {c['max_rel']}, rows {c['rows']})")
        if not p.get("state_compared", True) and (p["backend"], "state") not in seen:
            seen.add((p["backend"], "state"))
            lines.append(f"{where}: the state not compared (the backend has no state_snapshot);"
                         " the tokens, the logits and the next write's position were")
        if not p.get("greedy_matches_reference", True) and (p["backend"], p["depth"]) not in seen:
            seen.add((p["backend"], p["depth"]))
            lines.append(f"{where}: the one-token decode leaves the reference's greedy tokens "
                         f"after {p.get('reference_agree')} (float rounding at a near-tie)")
    return lines
