"""Charts of a benchmark report: prompt tokens per turn and cumulative, for every arm, and,
when the run was priced, cumulative billed dollars per arm (the cache effect at a glance).

``write_chart(report, path)`` picks the format from the suffix: ``.svg`` (self-contained, no
dependencies), ``.html`` (the SVG plus the totals and the verdict, self-contained) or ``.png``
(needs matplotlib: ``pip install 'skillstate-proxy[chart]'``).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "baseline": "#c0392b",
    "mask": "#27ae60",
    "state": "#2471a3",
    "window": "#d68910",
    "auto": "#8e44ad",
}
LABELS = {
    "baseline": "baseline (full transcript)",
    "mask": "mask (old observations masked)",
    "state": "state (through the proxy)",
    "window": "window (state + recent messages)",
    "auto": "auto (cheapest form)",
}

W, H = 1100, 495
ROW_H = 400  # the dollars panel's row, below the token panels
PANEL_W, PANEL_H = 450, 300
MARGIN_L, MARGIN_T = 80, 110
GAP = 110


def arm_names(report: Mapping[str, Any]) -> list[str]:
    return list(report.get("arms") or ("baseline", "state"))


def series(report: Mapping[str, Any]) -> dict[str, list[tuple[int, int | None]]]:
    """arm -> [(turn, prompt tokens or None for a failed call)]."""
    out: dict[str, list[tuple[int, int | None]]] = {n: [] for n in arm_names(report)}
    for row in report["per_turn"]:
        for arm in out:
            cell = row.get(arm)
            if cell is not None:
                out[arm].append((row["turn"], cell.get("prompt_tokens")))
    return out


def dollar_series(report: Mapping[str, Any]) -> dict[str, list[tuple[int, float | None]]]:
    """arm -> [(turn, cumulative billed USD)], only for arms whose every call was priced."""
    out: dict[str, list[tuple[int, float | None]]] = {}
    for arm in arm_names(report):
        pts = [(r["turn"], r.get(f"cum_cost_{arm}")) for r in report["per_turn"] if r.get(arm)]
        if pts and all(v is not None for _, v in pts):
            out[arm] = pts
    return out


def cumulative(points: Sequence[tuple[int, int | None]]) -> list[tuple[int, int]]:
    total = 0
    out: list[tuple[int, int]] = []
    for turn, v in points:
        total += v or 0
        out.append((turn, total))
    return out


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = [round(start, 10)]
    while ticks[-1] < hi and len(ticks) <= 50:
        ticks.append(round(start + step * len(ticks), 10))
    return ticks


def usd(v: float) -> str:
    return f"${v:.3g}" if v else "$0"


def human(v: float) -> str:
    a = abs(v)
    if a >= 1_000_000:
        return f"{v / 1_000_000:.3g}M"
    if a >= 1_000:
        return f"{v / 1_000:.3g}k"
    return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"


def _panel(
    x0: float,
    y0: float,
    title: str,
    data: Mapping[str, Sequence[tuple[int, float | None]]],
    n_turns: int,
    marker: int | None = None,
    fmt: Any = None,
) -> list[str]:
    fmt = fmt or human
    values = [v for pts in data.values() for _, v in pts if v is not None]
    y_ticks = nice_ticks(0, max(values) if values else 1)
    y_max = y_ticks[-1] or 1
    x_ticks = [t for t in nice_ticks(1, max(n_turns, 2), 8) if 1 <= t <= n_turns] or [1]
    if x_ticks[0] != 1:
        x_ticks.insert(0, 1)

    def sx(turn: float) -> float:
        return x0 + (turn - 1) / max(n_turns - 1, 1) * PANEL_W

    def sy(v: float) -> float:
        return y0 + PANEL_H - v / y_max * PANEL_H

    out = [f'<text x="{x0}" y="{y0 - 14}" class="ptitle">{html.escape(title)}</text>']
    for t in y_ticks:
        y = sy(t)
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{x0 - 8}" y="{y + 4:.1f}" class="ytick">{fmt(t)}</text>')
    for t in x_ticks:
        x = sx(t)
        y = y0 + PANEL_H
        out.append(f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 5}" class="axis"/>')
        out.append(f'<text x="{x:.1f}" y="{y0 + PANEL_H + 20}" class="xtick">{int(t)}</text>')
    bottom = y0 + PANEL_H
    out.append(f'<line x1="{x0}" y1="{bottom}" x2="{x0 + PANEL_W}" y2="{bottom}" class="axis"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 + PANEL_H}" class="axis"/>')
    out.append(
        f'<text x="{x0 + PANEL_W / 2}" y="{bottom + 42}" class="xlabel">turn (model call)</text>'
    )
    if marker is not None and 1 <= marker <= n_turns:
        x = sx(marker)
        out.append(
            f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + PANEL_H}" '
            'stroke="#888" stroke-dasharray="4 4"/>'
        )
        out.append(
            f'<text x="{x + 6:.1f}" y="{y0 + 14}" class="note">break-even: turn {marker}</text>'
        )
    for arm, pts in data.items():
        good = [(t, v) for t, v in pts if v is not None]
        if good:
            path = " ".join(f"{sx(t):.1f},{sy(v):.1f}" for t, v in good)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{COLORS[arm]}" '
                f'stroke-width="2.2" stroke-linejoin="round"/>'
            )
            if len(good) <= 40:
                for t, v in good:
                    out.append(
                        f'<circle cx="{sx(t):.1f}" cy="{sy(v):.1f}" r="2.6" fill="{COLORS[arm]}"/>'
                    )
        for t, maybe in pts:
            if maybe is None:  # a failed call: marked, never drawn as 0
                x, y = sx(t), y0 + PANEL_H
                out.append(
                    f'<path d="M{x - 5:.1f},{y - 5:.1f} L{x + 5:.1f},{y + 5:.1f} M{x - 5:.1f},'
                    f'{y + 5:.1f} L{x + 5:.1f},{y - 5:.1f}" stroke="{COLORS[arm]}" '
                    f'stroke-width="2.5"><title>{arm}: call {t} failed</title></path>'
                )
    return out


def _subtitle(report: Mapping[str, Any], with_cost: bool = True) -> str:
    arms = report["arms"]
    b, s = arms["baseline"], arms[_primary(report)]
    totals = ", ".join(f"{n} {human(a['prompt_tokens'])}" for n, a in arms.items())
    parts = [f"total prompt tokens: {totals}"]
    sv = report["savings"]
    if sv.get("prompt_tokens_pct") is not None:
        parts.append(f"{sv['prompt_tokens_pct']:g}% fewer")
    elif sv.get("per_call_pct") is not None:
        parts.append(f"{sv['per_call_pct']:g}% fewer per call")
    if sv.get("break_even_turn") is not None:
        parts.append(f"break-even at turn {sv['break_even_turn']}")
    if with_cost and b.get("cost_usd") is not None and s.get("cost_usd") is not None:
        params = report.get("params") or {}
        priced = params.get("price_as")
        label = f"billed as {priced}" if priced else "cost"
        if priced and report.get("simulated"):
            label += " (hypothetical"
            label += f", {params['cache_regime']} cache)" if params.get("cache_regime") else ")"
        costs = ", ".join(
            f"{n} ${a['cost_usd']:.4f}" for n, a in arms.items() if a.get("cost_usd") is not None
        )
        parts.append(f"{label}: {costs}")
    return " · ".join(parts)


def _primary(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    return "state" if "state" in arms else next(n for n in arms if n != "baseline")


def _billed_totals(report: Mapping[str, Any], x: float, y: float) -> list[str]:
    """The billed totals per arm, as text beside the dollars panel."""
    arms = report["arms"]
    by_arm = (report.get("savings") or {}).get("by_arm") or {}
    out = [f'<text x="{x}" y="{y}" class="ptitle">Billed over the run</text>']
    for i, (name, a) in enumerate(arms.items()):
        if a.get("cost_usd") is None:
            continue
        line = f"{name}: ${a['cost_usd']:.4f}"
        pct = (by_arm.get(name) or {}).get("cost_pct")
        if pct is not None:
            line += f" ({pct:g}% cheaper)" if pct >= 0 else f" ({-pct:g}% MORE)"
        out.append(
            f'<rect x="{x}" y="{y + 20 + 24 * i}" width="18" height="4" fill="{COLORS[name]}"/>'
        )
        out.append(
            f'<text x="{x + 24}" y="{y + 26 + 24 * i}" class="legend">{html.escape(line)}</text>'
        )
    return out


def render_svg(report: Mapping[str, Any]) -> str:
    data = series(report)
    n = max((t for pts in data.values() for t, _ in pts), default=1)
    cum = {arm: cumulative(pts) for arm, pts in data.items()}
    dollars = dollar_series(report)
    height = H + (ROW_H if dollars else 0)
    params = report.get("params") or {}
    title = f"skillstate bench · {report['workload']} · model {report['model']}"
    if report.get("simulated"):
        title += " (SIMULATED)"
    if len(data) > 2:
        title += f" · arms {', '.join(data)}"
    else:
        title += f" · mode {params.get('mode', '?')}"
    invalid = str(report.get("verdict", "")).startswith("INVALID")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" font-family="Helvetica, Arial, sans-serif">',
        "<style>"
        ".title{font-size:19px;font-weight:bold;fill:#222}"
        ".sub{font-size:13px;fill:#444}"
        ".ptitle{font-size:15px;font-weight:bold;fill:#333}"
        ".grid{stroke:#e4e4e4;stroke-width:1}"
        ".axis{stroke:#777;stroke-width:1}"
        ".ytick{font-size:11px;fill:#555;text-anchor:end}"
        ".xtick{font-size:11px;fill:#555;text-anchor:middle}"
        ".xlabel{font-size:12px;fill:#555;text-anchor:middle}"
        ".legend{font-size:13px;fill:#222}"
        ".warn{font-size:13px;font-weight:bold;fill:#c0392b}"
        ".note{font-size:11px;fill:#666}"
        "</style>",
        f'<rect width="{W}" height="{height}" fill="#ffffff"/>',
        f'<text x="{MARGIN_L - 50}" y="30" class="title">{html.escape(title)}</text>',
        f'<text x="{MARGIN_L - 50}" y="52" class="sub">'
        f"{html.escape(_subtitle(report, with_cost=not dollars))}</text>",
    ]
    lx = MARGIN_L - 50
    for arm in data:
        parts.append(f'<rect x="{lx}" y="66" width="18" height="4" fill="{COLORS[arm]}"/>')
        parts.append(f'<text x="{lx + 24}" y="72" class="legend">{html.escape(LABELS[arm])}</text>')
        lx += 250 if len(data) <= 2 else 230
    if invalid:
        parts.append(
            f'<text x="{lx + 20}" y="72" class="warn">INVALID RUN: failed calls (marked ×)</text>'
        )
    parts += _panel(MARGIN_L, MARGIN_T, "Prompt tokens per turn", data, n)
    be = (report.get("savings") or {}).get("break_even_turn")
    parts += _panel(
        MARGIN_L + PANEL_W + GAP, MARGIN_T, "Cumulative prompt tokens", dict(cum), n, be
    )
    if dollars:
        title = "Cumulative billed dollars"
        params = report.get("params") or {}
        if params.get("price_as"):
            title += f" ({params['price_as']}"
            title += f", {params['cache_regime']} cache" if params.get("cache_regime") else ""
            title += ", hypothetical)" if report.get("simulated") else ")"
        parts += _panel(MARGIN_L, MARGIN_T + ROW_H, title, dollars, n, fmt=usd)
        parts += _billed_totals(report, MARGIN_L + PANEL_W + GAP, MARGIN_T + ROW_H + 20)
    source = params.get("token_counts") or ("simulated" if report.get("simulated") else "")
    foot = f"token counts: {source}" if source else ""
    if report.get("revision"):
        foot += f" · revision {str(report['revision'])[:12]}"
    foot += f" · skillstate {report.get('version', '?')}"
    parts.append(
        f'<text x="{MARGIN_L - 50}" y="{height - 8}" class="note">{html.escape(foot)}</text>'
    )
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    rows = []
    for name in arms:
        a = arms[name]
        cost = "—" if a.get("cost_usd") is None else f"${a['cost_usd']:.4f}"
        rows.append(
            f"<tr><td>{name}</td><td>{a['calls']}</td><td>{a['failures']}</td>"
            f"<td>{a['prompt_tokens']:,}</td><td>{a['prompt_tokens_per_call'] or '—'}</td>"
            f"<td>{a['completion_tokens']:,}</td><td>{cost}</td></tr>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>skillstate bench: {html.escape(report['workload'])}</title>"
        "<style>body{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;"
        "padding:4px 10px;text-align:right}td:first-child,th:first-child{text-align:left}"
        ".verdict{max-width:1050px;padding:10px;background:#f4f6f8;border-left:4px solid #2471a3}"
        "</style></head><body>"
        + render_svg(report)
        + "<table><tr><th>arm</th><th>calls</th><th>failures</th><th>prompt tokens</th>"
        "<th>per call</th><th>completion</th><th>cost</th></tr>"
        + "".join(rows)
        + "</table>"
        + f"<p class='verdict'>{html.escape(report['verdict'])}</p>"
        + "</body></html>\n"
    )


def _write_png(report: Mapping[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError(
            "a PNG chart needs matplotlib (pip install 'skillstate-proxy[chart]'); "
            "use --chart FILE.svg or FILE.html instead"
        ) from None
    data = series(report)
    dollars = dollar_series(report)
    fig, grid = plt.subplots(2 if dollars else 1, 2, figsize=(12, 9.6 if dollars else 4.8))
    axes = grid[0] if dollars else grid
    if dollars:
        for arm, money in dollars.items():
            grid[1][0].plot(
                [t for t, _ in money], [v for _, v in money], color=COLORS[arm], label=LABELS[arm]
            )
        grid[1][0].set_title("Cumulative billed dollars")
        grid[1][0].set_xlabel("turn (model call)")
        grid[1][0].grid(alpha=0.3)
        grid[1][0].legend()
        grid[1][1].axis("off")
    for arm, pts in data.items():
        good = [(t, v) for t, v in pts if v is not None]
        axes[0].plot(
            [t for t, _ in good], [v for _, v in good], color=COLORS[arm], label=LABELS[arm]
        )
        cum = cumulative(pts)
        axes[1].plot([t for t, _ in cum], [v for _, v in cum], color=COLORS[arm], label=LABELS[arm])
    axes[0].set_title("Prompt tokens per turn")
    axes[1].set_title("Cumulative prompt tokens")
    for ax in axes:
        ax.set_xlabel("turn (model call)")
        ax.grid(alpha=0.3)
        ax.legend()
    sim = " (SIMULATED)" if report.get("simulated") else ""
    fig.suptitle(
        f"skillstate bench · {report['workload']} · {report['model']}{sim}\n{_subtitle(report)}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_chart(report: Mapping[str, Any], path: Path) -> None:
    """Write the chart; the format follows the suffix (.svg, .html/.htm, .png)."""
    suffix = path.suffix.lower()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".svg":
        path.write_text(render_svg(report) + "\n", encoding="utf-8")
    elif suffix in (".html", ".htm"):
        path.write_text(render_html(report), encoding="utf-8")
    elif suffix == ".png":
        _write_png(report, path)
    else:
        raise RuntimeError(f"unknown chart format {suffix or '(none)'}: use .svg, .html or .png")
