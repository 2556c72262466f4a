"""Charts of a benchmark report: prompt tokens per turn and cumulative, for both arms.

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

COLORS = {"baseline": "#c0392b", "state": "#2471a3"}
LABELS = {"baseline": "baseline (full transcript)", "state": "state (through the proxy)"}

W, H = 1100, 495
PANEL_W, PANEL_H = 450, 300
MARGIN_L, MARGIN_T = 80, 110
GAP = 110


def series(report: Mapping[str, Any]) -> dict[str, list[tuple[int, int | None]]]:
    """arm -> [(turn, prompt tokens or None for a failed call)]."""
    out: dict[str, list[tuple[int, int | None]]] = {"baseline": [], "state": []}
    for row in report["per_turn"]:
        for arm in out:
            cell = row.get(arm)
            if cell is not None:
                out[arm].append((row["turn"], cell.get("prompt_tokens")))
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
    data: Mapping[str, Sequence[tuple[int, int | None]]],
    n_turns: int,
    marker: int | None = None,
) -> list[str]:
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
        out.append(f'<text x="{x0 - 8}" y="{y + 4:.1f}" class="ytick">{human(t)}</text>')
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


def _subtitle(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    b, s = arms["baseline"], arms["state"]
    totals = f"baseline {human(b['prompt_tokens'])}, state {human(s['prompt_tokens'])}"
    parts = [f"total prompt tokens: {totals}"]
    sv = report["savings"]
    if sv.get("prompt_tokens_pct") is not None:
        parts.append(f"{sv['prompt_tokens_pct']:g}% fewer")
    elif sv.get("per_call_pct") is not None:
        parts.append(f"{sv['per_call_pct']:g}% fewer per call")
    if sv.get("break_even_turn") is not None:
        parts.append(f"break-even at turn {sv['break_even_turn']}")
    if b.get("cost_usd") is not None and s.get("cost_usd") is not None:
        priced = (report.get("params") or {}).get("price_as")
        label = f"cost priced as {priced}" if priced else "cost"
        parts.append(f"{label}: ${b['cost_usd']:.4f} vs ${s['cost_usd']:.4f}")
    return " · ".join(parts)


def render_svg(report: Mapping[str, Any]) -> str:
    data = series(report)
    n = max((t for pts in data.values() for t, _ in pts), default=1)
    cum = {arm: cumulative(pts) for arm, pts in data.items()}
    params = report.get("params") or {}
    title = f"skillstate bench · {report['workload']} · model {report['model']}"
    if report.get("simulated"):
        title += " (SIMULATED)"
    title += f" · mode {params.get('mode', '?')}"
    invalid = str(report.get("verdict", "")).startswith("INVALID")
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif">',
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
        f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{MARGIN_L - 50}" y="30" class="title">{html.escape(title)}</text>',
        f'<text x="{MARGIN_L - 50}" y="52" class="sub">{html.escape(_subtitle(report))}</text>',
    ]
    lx = MARGIN_L - 50
    for arm in ("baseline", "state"):
        parts.append(f'<rect x="{lx}" y="66" width="18" height="4" fill="{COLORS[arm]}"/>')
        parts.append(f'<text x="{lx + 24}" y="72" class="legend">{html.escape(LABELS[arm])}</text>')
        lx += 250
    if invalid:
        parts.append(
            f'<text x="{lx + 20}" y="72" class="warn">INVALID RUN: failed calls (marked ×)</text>'
        )
    parts += _panel(MARGIN_L, MARGIN_T, "Prompt tokens per turn", data, n)
    be = (report.get("savings") or {}).get("break_even_turn")
    parts += _panel(
        MARGIN_L + PANEL_W + GAP, MARGIN_T, "Cumulative prompt tokens", dict(cum), n, be
    )
    source = params.get("token_counts") or ("simulated" if report.get("simulated") else "")
    foot = f"token counts: {source}" if source else ""
    if report.get("revision"):
        foot += f" · revision {str(report['revision'])[:12]}"
    foot += f" · skillstate {report.get('version', '?')}"
    parts.append(f'<text x="{MARGIN_L - 50}" y="{H - 8}" class="note">{html.escape(foot)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(report: Mapping[str, Any]) -> str:
    arms = report["arms"]
    rows = []
    for name in ("baseline", "state"):
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
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
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
