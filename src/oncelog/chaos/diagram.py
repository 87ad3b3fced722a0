"""Sequence diagrams of scenario runs: self-contained HTML with an inline SVG, like the seed's
figures: a producer lane and a broker lane, batches going right, answers coming back, lost
messages stopping half-way with a cross, notes for timeouts and epoch bumps."""

from __future__ import annotations

import html

from .outcome import Outcome, Step

WIDTH = 900
LEFT, RIGHT = 170, 730
ROW = 34
TOP = 70
COLOURS = {"normal": "#1f4e79", "ok": "#2e7d32", "error": "#c62828", "duplicate": "#6a1b9a"}


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _arrow(y: int, step: Step) -> list[str]:
    going_right = step.kind == "request"
    start, end = (LEFT, RIGHT) if going_right else (RIGHT, LEFT)
    colour = COLOURS[step.tone]
    stop = (start + end) // 2 if step.lost else end
    parts = [f'<line x1="{start}" y1="{y}" x2="{stop}" y2="{y}" stroke="{colour}" '
             f'stroke-width="2" marker-end="url(#head-{step.tone})"'
             + (' stroke-dasharray="6 4"' if step.lost else "") + "/>"]
    label_x = (start + end) // 2 + (60 if step.lost and not going_right else 0)
    label_x -= 60 if step.lost and going_right else 0
    parts.append(f'<text x="{label_x}" y="{y - 7}" text-anchor="middle" fill="{colour}" '
                 f'font-size="13">{_esc(step.text)}</text>')
    if step.lost:
        cross_x = stop + 14 if going_right else stop - 70
        parts.append(f'<text x="{cross_x}" y="{y + 6}" fill="#c62828" font-size="16" '
                     f'font-weight="bold">✕ lost</text>')
    return parts


def _note(y: int, step: Step) -> list[str]:
    # Notes sit on their lane's side and may run across the middle: they are the narration.
    width = 560
    x = LEFT - 60 if step.kind == "producer-note" else RIGHT + 60 - width
    return [f'<rect x="{x}" y="{y - 15}" width="{width}" height="24" rx="4" fill="#fff8e1" '
            f'stroke="#f9a825"/>',
            f'<text x="{x + 8}" y="{y + 2}" font-size="11" fill="#5d4037">'
            f'{_esc(_shorten(step.text, 95))}<title>{_esc(step.text)}</title></text>']


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def svg(outcome: Outcome) -> str:
    height = TOP + ROW * (len(outcome.steps) + 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'font-family="sans-serif">', "<defs>"]
    for tone, colour in COLOURS.items():
        parts.append(f'<marker id="head-{tone}" markerWidth="10" markerHeight="8" refX="9" '
                     f'refY="4" orient="auto"><path d="M0,0 L10,4 L0,8 z" fill="{colour}"/>'
                     "</marker>")
    parts.append("</defs>")
    for x, name in ((LEFT, "Producer"), (RIGHT, "Broker (oncelog)")):
        parts.append(f'<rect x="{x - 80}" y="10" width="160" height="32" rx="6" '
                     f'fill="#e3f2fd" stroke="#1f4e79"/>')
        parts.append(f'<text x="{x}" y="31" text-anchor="middle" font-weight="bold">'
                     f"{name}</text>")
        parts.append(f'<line x1="{x}" y1="42" x2="{x}" y2="{height - 10}" stroke="#90a4ae" '
                     f'stroke-dasharray="4 4"/>')
    for i, step in enumerate(outcome.steps):
        y = TOP + ROW * i
        parts += _arrow(y, step) if step.kind in ("request", "response") else _note(y, step)
    parts.append("</svg>")
    return "\n".join(parts)


def render_html(outcome: Outcome) -> str:
    verdict_colour = "#2e7d32" if outcome.passed else "#c62828"
    kafka = (f"<p><b>What Kafka does here:</b> {_esc(outcome.kafka_note)}</p>"
             if outcome.kafka_note else "")
    rows = "".join(f"<tr><td>{offset}</td><td>{_esc(value)}</td></tr>"
                   for offset, value in zip(outcome.offsets, outcome.log, strict=True))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{_esc(outcome.title)}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:960px}}
table{{border-collapse:collapse;font-size:12px}}td{{border:1px solid #ccc;padding:1px 6px}}
.verdict{{font-size:18px;font-weight:bold;color:{verdict_colour}}}</style></head>
<body><h1>{_esc(outcome.title)}</h1>
<p class="verdict">{_esc(outcome.verdict)}</p>
{kafka}
{svg(outcome)}
<h2>The partition afterwards</h2>
<table><tr><th>offset</th><th>record (batch:sequence)</th></tr>{rows}</table>
</body></html>
"""
