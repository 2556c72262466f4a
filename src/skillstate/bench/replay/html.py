"""``--html OUT``: one self-contained page (inline SVG and CSS, no script, no CDN): per
cache regime, the cumulative billed dollars of every arm over the replayed calls, the
verbatim reach of every arm, and the totals table."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from skillstate.bench.chart import nice_ticks, usd

from .run import COSTS

__all__ = ["render_html"]

COLORS = {
    "passthrough": "#c0392b",
    "mask": "#27ae60",
    "state": "#2471a3",
    "window": "#d68910",
    "auto": "#8e44ad",
}
W, H, L, T, R, B = 760, 320, 70, 20, 150, 40


def _color(arm: str) -> str:
    return COLORS.get(arm, "#555")


def _cumulative(values: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def dollars_svg(series: Mapping[str, Sequence[float]]) -> str:
    """Cumulative dollars per arm over the calls (every session's calls in order)."""
    curves = {arm: _cumulative(v) for arm, v in series.items() if v}
    n = max((len(c) for c in curves.values()), default=0)
    top = max((c[-1] for c in curves.values() if c), default=0.0) or 1.0
    ticks = nice_ticks(0, top)
    top = ticks[-1]
    pw, ph = W - L - R, H - T - B
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img">'
    ]
    for t in ticks:
        y = T + ph - ph * t / top
        out.append(f'<line x1="{L}" x2="{L + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{usd(t)}</text>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 8}" text-anchor="middle">calls ({n})</text>')
    for k, (arm, curve) in enumerate(curves.items()):
        step = max(1, len(curve) // 600)  # at most ~600 points a line
        pts = " ".join(
            f"{L + pw * (i + 1) / max(n, 1):.1f},{T + ph - ph * v / top:.1f}"
            for i, v in enumerate(curve)
            if i % step == 0 or i == len(curve) - 1
        )
        out.append(
            f'<polyline fill="none" stroke="{_color(arm)}" stroke-width="2" points="{pts}"/>'
        )
        y = T + 14 + 18 * k
        out.append(
            f'<rect x="{L + pw + 12}" y="{y - 9}" width="12" height="4" fill="{_color(arm)}"/>'
        )
        label = f"{arm} {usd(curve[-1])}"
        out.append(f'<text x="{L + pw + 30}" y="{y - 3}">{html.escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)


def reach_svg(arms: Mapping[str, Any]) -> str:
    """Verbatim reach (solid) and reach with the state's text (light) per arm."""
    rows = [(a, s.get("reach"), s.get("reach_with_state")) for a, s in arms.items()]
    height = 24 * len(rows) + 30
    left, pw = 100, W - 100 - 300  # room for the arm names and the figures
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" '
        f'viewBox="0 0 {W} {height}" role="img">'
    ]
    for k, (arm, verbatim, with_state) in enumerate(rows):
        y = 10 + 24 * k
        out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{html.escape(arm)}</text>')
        if with_state is not None:
            out.append(
                f'<rect x="{left}" y="{y}" width="{pw * with_state:.1f}" height="16" '
                f'fill="{_color(arm)}" opacity="0.3"/>'
            )
        if verbatim is not None:
            out.append(
                f'<rect x="{left}" y="{y}" width="{pw * verbatim:.1f}" height="16" '
                f'fill="{_color(arm)}"/>'
            )
        text = (
            "no reachable tokens"
            if verbatim is None
            else (f"{100 * verbatim:.0f}% verbatim, {100 * (with_state or 0):.0f}% with the state")
        )
        out.append(f'<text x="{left + pw + 8}" y="{y + 13}">{text}</text>')
    out.append("</svg>")
    return "".join(out)


def _table(arms: Mapping[str, Any]) -> str:
    head = [
        "arm",
        "billed",
        "vs passthrough",
        *COSTS,
        "reach",
        "reach+state",
        "calls",
        "errors",
        "invalid",
        "envelope share of output",
    ]
    rows = [
        "<tr>" + "".join(f"<th>{html.escape(h.replace('_', ' '))}</th>" for h in head) + "</tr>"
    ]
    for arm, a in arms.items():
        cells = [
            arm,
            f"${a['usd']:.4f}",
            "-" if a["ratio"] is None else f"{a['ratio']:.3f}x",
            *(f"${a['usd_split'][c]:.4f}" for c in COSTS),
            "-" if a["reach"] is None else f"{100 * a['reach']:.1f}%",
            "-" if a["reach_with_state"] is None else f"{100 * a['reach_with_state']:.1f}%",
            a["calls"],
            a["errors"],
            a["invalid"],
            f"{100 * a['envelope_output_share']:.1f}%",
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return "<table>" + "".join(rows) + "</table>"


def _path_list(items: list[Mapping[str, str]]) -> str:
    """The list items of ``problems`` or ``skipped``: each path and why."""
    return "".join(f"<li>{html.escape(p['path'])}: {html.escape(p['reason'])}</li>" for p in items)


def render_html(report: Mapping[str, Any]) -> str:
    sections = []
    for regime, arms in report["totals"].items():
        series = report["per_call_usd"].get(regime, {})
        sections.append(
            f"<h2>{html.escape(regime)} cache regime</h2>"
            f"<h3>cumulative billed dollars over the calls</h3>{dollars_svg(series)}"
            f"<h3>verbatim reach</h3>{reach_svg(arms)}{_table(arms)}"
        )
    problems, skipped = _path_list(report["problems"]), _path_list(report["skipped"])
    opts = report["options"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>skillstate replay</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}"
        "table{border-collapse:collapse;margin:8px 0 24px}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}th{background:#f4f4f4}svg text{font-size:12px}"
        "</style></head><body>"
        f"<h1>skillstate replay: {len(report['sessions'])} session(s)</h1>"
        f"<p>priced as {html.escape(str(opts['price_as']))}; arms "
        f"{html.escape(', '.join(opts['arms']))}; {report['seconds']} s</p>"
        + "".join(sections)
        + (f"<h2>not replayed</h2><ul>{problems}</ul>" if problems else "")
        + (f"<h2>nothing to replay</h2><ul>{skipped}</ul>" if skipped else "")
        + "</body></html>"
    )
