"""What a training run cost, summed over its segments: a run interrupted and resumed is trained in
several processes, and its cost is all of them, not the last.

The clock's state travels in the checkpoint (so it is exactly the state at the checkpoint's step:
steps re-done after a hard kill are counted once, in the segment that kept them) and run.json
reports it: `started` (the first segment's), `segments` [{started, seconds, first_step, last_step}],
`wall_seconds` (their sum) and the step-time median over every step of every segment, each
segment's first step left out (it pays for warm-up).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

CHECKPOINT_KEY = "clock"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class RunClock:
    segments: list[dict] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)  # every step's seconds, in step order
    warmup_steps: list[int] = field(default_factory=list)  # index into step_times of each segment's first step
    _t0: float = 0.0

    @classmethod
    def resumed(cls, state: dict | None, start_step: int, t0: float) -> RunClock:
        """The clock stored with a checkpoint at `start_step` (empty when the checkpoint predates clocks),
        with a new segment begun at `t0` (perf_counter)."""
        state = state or {}
        clock = cls([dict(s) for s in state.get("segments", [])], list(state.get("step_times", []))[:start_step],
                    [i for i in state.get("warmup_steps", []) if i < start_step])
        clock.begin(start_step, t0)
        return clock

    def begin(self, step: int, t0: float | None = None) -> None:
        self._t0 = time.perf_counter() if t0 is None else t0
        self.segments.append({"started": now_iso(), "seconds": 0.0, "first_step": step + 1, "last_step": step})

    def step_done(self, seconds: float) -> None:
        if self.segments[-1]["last_step"] < self.segments[-1]["first_step"]:
            self.warmup_steps.append(len(self.step_times))
        self.step_times.append(seconds)
        self.segments[-1]["last_step"] += 1

    def state(self) -> dict:
        """For the checkpoint: the segments so far, the current one up to now."""
        self.segments[-1]["seconds"] = round(time.perf_counter() - self._t0, 3)
        return {"segments": [dict(s) for s in self.segments], "step_times": list(self.step_times),
                "warmup_steps": list(self.warmup_steps)}

    def median_step_time(self) -> float | None:
        warm = set(self.warmup_steps)
        timed = [t for i, t in enumerate(self.step_times) if i not in warm] or self.step_times
        return statistics.median(timed) if timed else None

    def summary(self) -> dict:
        """run.json's keys: first start, segments, total wall time, resumed count."""
        state = self.state()
        return {"started": state["segments"][0]["started"], "segments": state["segments"],
                "wall_seconds": round(sum(s["seconds"] for s in state["segments"]), 3),
                "resumed": len(state["segments"]) - 1}
