"""Rows of measurements (dicts) as markdown or terminal tables; JSON and CSV files."""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

from diffuse.recording import write_atomic

# (key in the row, header, format string or a function of the value)
Columns = list[tuple[str, str, str | Callable]]


def on_off(value: bool) -> str:
    return "on" if value else "off"


def _fmt(fmt, value) -> str:
    if value is None:
        return ""
    return fmt(value) if callable(fmt) else fmt.format(value)


def _cells(rows: list[dict], columns: Columns) -> tuple[list[str], list[list[str]]]:
    # Only the columns some row has, so optional measurements drop out cleanly.
    cols = [c for c in columns if any(c[0] in r for r in rows)]
    body = [[_fmt(fmt, r.get(k)) for k, _, fmt in cols] for r in rows]
    return [h for _, h, _ in cols], body


def md_table(rows: list[dict], columns: Columns) -> str:
    header, body = _cells(rows, columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines) + "\n"


def text_table(rows: list[dict], columns: Columns) -> str:
    """Aligned columns for the terminal."""
    header, body = _cells(rows, columns)
    widths = [max(len(x) for x in col) for col in zip(header, *body)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(fmt.format(*r) for r in [header, *body]) + "\n"


def json_text(data) -> str:
    return json.dumps(data, indent=1, default=_plain) + "\n"


def write_json(path: Path, data) -> None:
    write_atomic(path, json_text(data).encode())


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO(newline="")
    w = csv.DictWriter(text, fieldnames=keys)
    w.writeheader()
    w.writerows(rows)
    write_atomic(path, text.getvalue().encode())


def _plain(x):
    """numpy scalars and arrays in JSON."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")
