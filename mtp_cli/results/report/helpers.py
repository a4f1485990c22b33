"""Small number formats shared by the report's sections ("–" for what is missing)."""

from __future__ import annotations

import math

from mtp_cli.results.report.format import NOT_MEASURED


def mean_of(values) -> float | None:
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return sum(nums) / len(nums) if nums else None



def num(value, digits: int = 3, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}{suffix}"



def pct(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.1f}%"



def whole(value) -> str:
    return "–" if value is None else f"{int(round(value)):,}"



def signed_whole(value) -> str:
    return f"{int(round(value)):+,}"



def times_base(value, base) -> str:
    return f" ({value / base:.2f}×)" if value and base else ""



def ratio(a, b) -> str:
    return f"{a / b:.2f}×" if a and b else "–"



def yes_no(value) -> str:
    return "–" if value is None else ("yes" if value else "**NO**")



def duration(seconds) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"



def short_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)



def value_range(values: list, fmt) -> str:
    if not values:
        return "?"
    return fmt(values[0]) if len(values) == 1 else f"{fmt(values[0])}–{fmt(values[-1])}"



def share(value) -> str:
    return NOT_MEASURED if value is None else pct(value)
