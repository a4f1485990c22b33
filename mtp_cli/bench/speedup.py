"""A method's speed-up over the baseline from the raw timed calls: the one computation that specbench writes
and `mtp specbench --recheck` repeats.

Every prompt (batch, above batch size 1) is timed once per repeat for every method, interleaved, so each
(prompt, repeat) cell pairs the method with the baseline under the same machine state. Two ratios per cell:
end to end (tokens/s, prefill included: the headline, what a user waits for) and decode only (the baseline's
time per output token after the first over the method's, TPOT). Each is summarised as the geometric mean
over cells with the crossed prompt × repeat interval of `stats.crossed_log_mean_ci`.
"""

from __future__ import annotations

import numpy as np

from mtp_cli.base.result_docs import ci_key
from mtp_cli.base.stats import crossed_log_mean_ci


def _cells(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens/s, seconds per output token after the first) per unit × repeat, from a method's raw rows
    (`raw.raw_rows`, in repeat order)."""
    rates, tpots = [], []
    for row in rows:
        bs, outs = row["batch_size"], row["outputs"]
        longest = [max(len(o) for o in outs[i:i + bs]) for i in range(0, len(outs), bs)]
        rates.append([t / s for t, s in zip(row["tokens"], row["seconds"])])
        tpots.append([(s - f) / (n - 1) if n > 1 else np.nan
                      for s, f, n in zip(row["seconds"], row["ttft_s"], longest)])
    return np.asarray(rates, dtype=float).T, np.asarray(tpots, dtype=float).T


def paired_speedups(rows: list[dict], base_rows: list[dict]) -> dict:
    """`speedup` (end to end) and `tpot_speedup` (decode only) of `rows` over `base_rows`, with intervals;
    units where either side generated at most one token have no TPOT and are left out of that figure."""
    rate, tpot = _cells(rows)
    base_rate, base_tpot = _cells(base_rows)
    out = {}
    out["speedup"], out[ci_key("speedup")] = crossed_log_mean_ci(np.log(rate / base_rate))
    decode = np.log(base_tpot / tpot)
    decode = decode[np.isfinite(decode).all(axis=1)]
    out["tpot_speedup"], out[ci_key("tpot_speedup")] = crossed_log_mean_ci(decode)
    return out
