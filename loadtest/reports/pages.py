"""Tables and charts as Markdown, HTML and PNG: the parts the run report, the comparison and the trend page share."""

from __future__ import annotations

import html
import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Table = tuple[list[str], list[list[str]]]
"""A table as its header and its rows, every cell already a string."""

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1400px;color:#222}
h1{margin-bottom:0.2em} h2{border-bottom:1px solid #ddd;padding-bottom:0.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:0.6em 0;font-size:0.9em}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top} th{background:#f5f5f5}
.PASS{color:#fff;background:#2e7d32;padding:2px 8px;border-radius:4px}
.FAIL{color:#fff;background:#c62828;padding:2px 8px;border-radius:4px}
.INCONCLUSIVE{color:#fff;background:#ef6c00;padding:2px 8px;border-radius:4px}
img{max-width:100%;border:1px solid #eee} pre{background:#f7f7f7;padding:8px;overflow:auto}
figure{margin:0.6em 0} figcaption{color:#444;font-size:0.9em;max-width:110ch;margin-top:0.3em}
"""


def png_bytes(fig: Figure) -> bytes:
    """A matplotlib figure as PNG bytes, drawn without a display (the Agg canvas)."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    return buf.getvalue()


def md_table(table: Table) -> str:
    """A Markdown table; ``|`` in a cell is escaped, and no rows read ``_none_``."""
    head, rows = table
    if not rows:
        return "_none_\n"
    esc = [[cell.replace("|", "\\|") for cell in row] for row in rows]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in esc]
    return "\n".join(lines) + "\n"


def html_table(table: Table) -> str:
    """An HTML table, every cell escaped; no rows read *none*."""
    head, rows = table
    if not rows:
        return "<p><em>none</em></p>"
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"
