"""Learning-rate schedules: linear warmup then cosine decay, or warmup-stable-decay (WSD)."""

from __future__ import annotations

import math

from mtp_cli.config.recipe import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    floor = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        decay_start = int(cfg.steps * (1 - cfg.decay_fraction))
        if step < decay_start:
            return cfg.lr
        frac = (step - decay_start) / max(1, cfg.steps - decay_start)
        return cfg.lr - (cfg.lr - floor) * min(frac, 1.0)
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * min(frac, 1.0)))
