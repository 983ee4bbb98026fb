"""What every table of the docs is made of: the rows of a record that passed, one row found by its fields, a cell,
a speed ratio, the configurations a record holds. ``tables.py`` and ``sweep_tables.py`` build on these."""

from __future__ import annotations

from .record import number

DASH = "–"


def ok_rows(rows: list[dict], **where) -> list[dict]:
    """The rows whose check passed and whose fields equal ``where`` (compared as text)."""
    return [r for r in rows if r["status"] == "ok" and all(r[k] == str(v) for k, v in where.items())]


def find(rows: list[dict], **where) -> dict | None:
    """The one row with these fields (any status), or None."""
    found = [r for r in rows if all(r[k] == str(v) for k, v in where.items())]
    if len(found) > 1:
        raise ValueError(f"more than one row with {where}")
    return found[0] if found else None


def cell(row: dict | None, field: str = "tflops", fmt: str = "{:.1f}") -> str:
    """A row's field formatted, 'OOM' for a run out of memory, '–' for no row or no value."""
    if row is None:
        return DASH
    if row["status"] == "oom":
        return "OOM"
    value = number(row, field) if row["status"] == "ok" else None
    return DASH if value is None else fmt.format(value)


def speed(fast: dict | None, slow: dict | None, fmt: str = "{:.2f}×") -> str:
    """How many times faster ``fast`` is than ``slow``: slow's time over fast's ('–' unless both passed)."""
    if fast is None or slow is None or fast["status"] != "ok" or slow["status"] != "ok":
        return DASH
    return fmt.format(float(slow["time_ms"]) / float(fast["time_ms"]))


def configs(rows: list[dict], *fields) -> list[tuple]:
    """The distinct values of ``fields`` in the rows, numbers in numeric order."""
    def key(values):
        return tuple((0, float(v), "") if v.replace(".", "", 1).isdigit() else (1, 0.0, v) for v in values)

    return sorted({tuple(r[f] for f in fields) for r in rows}, key=key)
