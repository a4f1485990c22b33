"""Published MTP numbers with their conditions (transcribed from docs/CLAIMS.md), for the report's
"claims vs measured" tables. Training evidence (quality, modules discarded) and inference evidence
(speed, modules kept) are kept apart, and every number travels with its model size, tokens, batch
size and hardware.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    source: str
    family: str  # "sequential" (DeepSeek-V3 modules) or "parallel" (Meta heads): which of our variants it matches
    metric: str
    value: str
    conditions: str


TRAINING: list[Claim] = [
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "HumanEval pass@1, NTP → MTP (D=1)", "20.7 → 26.8 (+6.1)",
          "MoE 15.7B total params, 1.33T tokens"),
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "GSM8K, NTP → MTP (D=1)", "25.4 → 31.4 (+6.0)",
          "MoE 15.7B total params, 1.33T tokens"),
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "Pile BPB, NTP → MTP (D=1)", "0.729 → 0.729 (±0)",
          "MoE 15.7B total params, 1.33T tokens"),
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "HumanEval pass@1, NTP → MTP (D=1)", "44.5 → 53.7 (+9.2)",
          "MoE 228.7B total params, 540B tokens"),
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "GSM8K, NTP → MTP (D=1)", "72.3 → 74.0 (+1.7)",
          "MoE 228.7B total params, 540B tokens"),
    Claim("DeepSeek-V3 §4.5.1 Tab. 4", "sequential", "Pile BPB, NTP → MTP (D=1)", "0.658 → 0.657 (−0.001)",
          "MoE 228.7B total params, 540B tokens"),
    Claim("Meta (Gloeckle et al.) Tab. S7", "parallel", "MBPP pass@1, n=1 → n=4", "1.8 → 1.0 (−0.8)", "0.3B params"),
    Claim("Meta (Gloeckle et al.) Tab. S7", "parallel", "MBPP pass@1, n=1 → n=4", "4.7 → 3.0 (−1.7)", "0.6B params"),
    Claim("Meta (Gloeckle et al.) Tab. S7", "parallel", "MBPP pass@1, n=1 → n=4", "6.8 → 7.4 (+0.6)", "1.3B params"),
    Claim("Meta (Gloeckle et al.) Tab. S7", "parallel", "MBPP pass@1, n=1 → n=4", "26.0 → 30.5 (+4.5)", "13B params"),
    Claim("Meta (Gloeckle et al.) §4.1", "parallel", "induction, n=2 vs n=1", "strong gain ≤ 30M non-embedding "
          "params; gone from 100M", "children's stories"),
]

INFERENCE: list[Claim] = [
    Claim("DeepSeek-V3 §5.4.3", "sequential", "2nd-token acceptance rate", "85–90%", "DeepSeek-V3 (671B MoE), D=1"),
    Claim("DeepSeek-V3 §5.4.3", "sequential", "speedup (tokens/s)", "≈1.8×", "DeepSeek-V3 (671B MoE), D=1"),
    Claim("SGLang docs", "sequential", "speedup", "1.8× at bs=1, 1.5× at bs=32", "DeepSeek-V3 MTP, H200 TP8"),
    Claim("Meta (Gloeckle et al.) Tab. S2", "parallel", "speedup (greedy)", "3.05× code (3.50 tokens/forward), "
          "2.74× Wikipedia, 2.67× books", "7B, n=4, batch size 42"),
]

# The seed tutorial's table cites no source and matches neither paper: shown only with this label.
TUTORIAL_LABEL = "tutorial claim, unsourced"
TUTORIAL = ("NTP 74.2% HumanEval / 82.6% GSM8K / 24.5 tok/s; Meta 4 heads 79.8% / 85.4% / 38.2 tok/s; "
            "DeepSeek MTP 82.6% / 88.9% / 44.1 tok/s, “1.8×”, “89.2% acceptance on code”, “≈2.5% training overhead”")
