"""The measurement as rich tables and note lines: renderables, never printed here."""

from __future__ import annotations

from harness.metrics import human_bytes

SHORT = {"snapshot_recompute": "snapshot+recompute", "dense_checkpoints": "dense checkpoints",
         "compact_replay": "compact replay", "compact_replay_ort_cpu": "compact (ORT CPU verify)",
         "compact_replay_ort_webgpu": "compact (ORT WebGPU)"}


def tables(data: dict) -> list:
    """One rich Table per layer shape: rows m, per strategy bytes moved, time and ✓/✗."""
    from rich.table import Table

    out = []
    for layer in data["layers"]:
        sh = layer["shape"]
        if layer["kind"] == "gdn":
            title = (f"GDN layers {layer['layers']} (Hk={sh['hk']} Hv={sh['hv']} Dk={sh['dk']} "
                     f"Dv={sh['dv']}): state {human_bytes(layer['closed_form']['state_bytes'])}, "
                     f"capsule {human_bytes(layer['closed_form']['capsule_row_bytes'])}/token, "
                     f"K={layer['draft_len']}")
        else:
            title = (f"attention layers {layer['layers']} (kv_heads={sh['kv_heads']} "
                     f"head_dim={sh['head_dim']}, depth {sh['depth']}): "
                     f"{human_bytes(layer['closed_form']['row_bytes'])} K+V per token")
        t = Table(title=title, title_justify="left", show_lines=True)
        t.add_column("m", justify="right")
        names = list(layer["rows"][0]["strategies"])
        for n in names:
            t.add_column(SHORT.get(n, n) + "\nstate r/w/copy +capsule\nms", justify="right")
        for r in layer["rows"]:
            cells = [str(r["m"])]
            for n in names:
                c = r["strategies"][n]
                if c["status"] != "ok":
                    cells.append(f"[dim]{c['status']}[/]")
                    continue
                b = c["bytes"]
                mark = "[green]✓[/]" if c["ok"] else "[red]✗[/]"
                cap = b["capsule_written"] + b["capsule_read"]
                cells.append(f"{human_bytes(b['state_read'], True)}/"
                             f"{human_bytes(b['state_written'], True)}/"
                             f"{human_bytes(b['state_copied'], True)} +{human_bytes(cap, True)}\n"
                             f"{c['time_ms']:.3f} {mark}")
            t.add_row(*cells)
        out.append(t)
    return out


def notes(data: dict) -> list[str]:
    """Unavailable strategies with their reasons, and failures (one line each)."""
    seen, lines = set(), []
    for layer in data["layers"]:
        for r in layer["rows"]:
            for n, c in r["strategies"].items():
                if c["status"] != "ok" and (n, c["reason"]) not in seen:
                    seen.add((n, c["reason"]))
                    lines.append(f"{SHORT.get(n, n)}: {c['status']}: {c['reason']}")
                elif c["status"] == "ok" and not c["ok"]:
                    lines.append(f"✗ {SHORT.get(n, n)} at m={r['m']}: max rel err "
                                 f"{c['max_rel_err']} > {data['tolerance']}")
    return lines
