"""`mtp specbench`'s conditions: which prompts, decoded at which temperature, and their names.

Kept apart from the benchmark so that recipe validation can check a `[specbench]` section (and its
`primary`) without loading the decoders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mtp_cli.base.errors import UserError

PROMPT_SETS = ("humaneval", "gsm8k", "heldout")  # the named prompt sets (mtp_cli.data.prompts loads them)
HELDOUT = "heldout"


@dataclass(frozen=True)
class Condition:
    """One prompt source decoded at one temperature."""
    source: str
    temperature: float

    @property
    def name(self) -> str:
        label = self.source if self.source in PROMPT_SETS else Path(self.source).stem
        return f"{label}-greedy" if self.temperature == 0 else f"{label}-t{self.temperature:g}"

    @property
    def baseline(self) -> str:
        """Our plain decoder's method name: the reference output and the baseline for speedups."""
        return "greedy" if self.temperature == 0 else "sample"


def plan_conditions(prompts: str | Sequence[str], temperatures: Sequence[float],
                    primary: str | None = None) -> tuple[list[Condition], str]:
    """Every prompt source × temperature, and the primary condition's name (default: the first)."""
    sources = [p.strip() for p in prompts.split(",")] if isinstance(prompts, str) else [str(p) for p in prompts]
    temps = list(temperatures)
    if not sources or any(not s for s in sources):
        raise UserError(f"--prompts needs one or more prompt sets, got {prompts!r}")
    if not temps or any(not isinstance(t, (int, float)) or not 0 <= t < float("inf") for t in temps):
        raise UserError(f"temperatures must be finite numbers >= 0, got {temps}")
    conditions = list(dict.fromkeys(Condition(s, float(t)) for s in sources for t in temps))
    names = [c.name for c in conditions]
    if len(set(names)) < len(names):
        raise UserError(f"two prompt sources share a name in {names}: rename one prompt file")
    primary = primary or names[0]
    if primary not in names:
        raise UserError(f"primary condition {primary!r} is not measured: choose one of {', '.join(names)}")
    return conditions, primary
