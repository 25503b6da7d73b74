"""The result table of ``bench_engine_gpu.py``: one ``Row`` per measured configuration, with tokens/s,
acceptance length, ratios to plain decoding and to the eager engine, Leviathan's prediction and the
efficiency against it, decode-step time, the wave's time outside its decode steps (prefill, admission,
outputs) and host reads per step; and the fastest row per batch against the transformers peer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Row:
    """One measured configuration."""

    model: str
    batch: int
    mode: str
    graphs: bool
    tokens: int = 0
    seconds: float = 0.0
    acceptance_length: float | None = None
    note: str = ""
    steps: int = 0
    step_seconds: float = 0.0
    syncs: int | None = None
    ahead: int = 0  # decode steps launched ahead of the step before them (plain or speculative)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


HEADER = (
    "model",
    "batch",
    "mode",
    "graphs",
    "tokens",
    "tok/s",
    "accept len",
    "vs plain",
    "graphs/eager",
    "Leviathan",
    "efficiency",
    "ms/step",
    "other ms",
    "syncs/step",
    "ahead",
)


def table_row(r: Row, plain: float | None, no_graph: float | None) -> tuple[str, ...]:
    """One row of the table (``plain``: the tok/s it is compared with; ``no_graph``: its eager twin)."""
    graphs = "on" if r.graphs else "off"
    if not r.tokens:
        return (r.model, str(r.batch), r.mode, graphs, "-", "-", "-", "-", r.note, "", "", "", "", "", "")
    acc = r.acceptance_length
    return (
        r.model,
        str(r.batch),
        r.mode,
        graphs,
        str(r.tokens),
        f"{r.tokens_per_s:.1f}",
        "-" if acc is None else f"{acc:.2f}",
        f"{r.tokens_per_s / plain:.2f}x" if plain else "-",
        f"{r.tokens_per_s / no_graph:.2f}x" if r.graphs and no_graph else "-",
        "-" if acc is None else f"{acc:.2f}x",
        f"{r.tokens_per_s / plain / acc:.2f}" if plain and acc and not r.mode.startswith("hf") else "-",
        f"{1e3 * r.step_seconds / r.steps:.2f}" if r.steps else "-",
        f"{1e3 * (r.seconds - r.step_seconds):.1f}" if r.steps else "-",
        "-" if r.syncs is None else str(r.syncs),
        f"{r.ahead / r.steps:.0%}" if r.steps else "-",
    )


def format_table(rows: list[Row]) -> str:
    """Aligned table with tokens/s, acceptance, vs-plain and graphs-vs-eager ratios, step time and host
    reads per step (the peer's rows: vs its own plain ``generate``)."""
    base = {(r.model, r.batch, r.graphs): r.tokens_per_s for r in rows if r.mode == "plain" and r.tokens}
    hf = {(r.model, r.batch): r.tokens_per_s for r in rows if r.mode == "hf generate" and r.tokens}
    eager = {(r.model, r.batch, r.mode): r.tokens_per_s for r in rows if not r.graphs and r.tokens}
    table = [HEADER]
    for r in rows:
        plain = (
            hf.get((r.model, r.batch)) if r.mode.startswith("hf") else base.get((r.model, r.batch, r.graphs))
        )
        table.append(table_row(r, plain, eager.get((r.model, r.batch, r.mode))))
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table
    )


def vs_peer(rows: list[Row]) -> str:
    """Per model and batch: the engine's fastest row against transformers' plain ``generate``."""
    lines = []
    for (model, batch), peer in {(r.model, r.batch): r for r in rows if r.mode == "hf generate"}.items():
        ours = [r for r in rows if r.model == model and r.batch == batch and r.tokens and "hf" not in r.mode]
        if ours and peer.tokens:
            best = max(ours, key=lambda r: r.tokens_per_s)
            graphs = "graphs on" if best.graphs else "graphs off"
            lines.append(
                f"{model} b={batch}: best {best.mode} ({graphs}) {best.tokens_per_s:.1f} tok/s = "
                f"{best.tokens_per_s / peer.tokens_per_s:.2f}x transformers' generate "
                f"({peer.tokens_per_s:.1f})"
            )
    return "\n".join(lines)


def vs_first_attention(rows: list[Row], first: str) -> str:
    """Each row of another attention path (``model/path``) against the first path's same row."""
    auto = {(r.model, r.batch, r.mode, r.graphs): r for r in rows if r.tokens and "/" not in r.model}
    lines = []
    for r in rows:
        base = auto.get((r.model.split("/")[0], r.batch, r.mode, r.graphs))
        if "/" in r.model and r.tokens and base is not None:
            graphs = "graphs" if r.graphs else "eager"
            lines.append(
                f"{r.model} b={r.batch} {r.mode} ({graphs}): {r.tokens_per_s:.1f} tok/s = "
                f"{r.tokens_per_s / base.tokens_per_s:.2f}x {first}'s {base.tokens_per_s:.1f}"
            )
    return "\n".join(lines)
