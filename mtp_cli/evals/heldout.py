"""Held-out quality: trunk cross-entropy / top-1, and each MTP depth's loss, top-1 and agreement.

`agree_k` is the acceptance-rate proxy: how often extra prediction k's argmax at position i equals
the trunk's own greedy prediction for the same token (its argmax at position i+k, given the true
prefix). For k = 1 that is exactly what greedy self-speculative decoding accepts on this text.

`report` is `mtp eval`'s held-out task: the run's validation split (or any text file) in
non-overlapping windows of the trained context, bits per byte over the UTF-8 bytes of exactly the
predicted tokens, and a bootstrap interval over windows. Per-window rows (window, mean loss, tokens,
bytes) come back under "windows" for the pairing file. Training logs `val_loss` on the first
eval_batches x batch_size of these same windows only, so `train_val` repeats that subset's loss here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from mtp_cli.base import stats
from mtp_cli.base.errors import UserError
from mtp_cli.corpus import token_data as corpus
from mtp_cli.data import shards
from mtp_cli.data import tokenizer as toklib
from mtp_cli.model import MTPModel
from mtp_cli.model import loss as L

BATCH = 8


@torch.no_grad()
def evaluate(model: MTPModel, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
             device: torch.device | str = "cpu", window_losses: list[float] | None = None,
             on_batch=None) -> dict[str, float]:
    """Token-weighted means over all batches. Keys: loss, top1, and per extra k: loss_k, top1_k, agree_k.
    `window_losses`, if given, receives each window's mean trunk loss; `on_batch()` runs after each batch."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}

    def add(key: str, total: torch.Tensor, n: int) -> None:
        sums[key] = sums.get(key, 0.0) + float(total)
        counts[key] = counts.get(key, 0) + n

    was_training = model.training
    model.eval()
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        logits = model(x)  # all_logits, through forward (an FSDP-sharded model gathers its root there)
        trunk_pred = logits[0].argmax(-1)
        n = y.numel()
        add("loss", L.cross_entropy(logits[0], y) * n, n)
        if window_losses is not None:
            per_token = F.cross_entropy(logits[0].float().transpose(1, 2), y, reduction="none")
            window_losses.extend(per_token.mean(1).tolist())
        add("top1", (trunk_pred == y).sum(), n)
        for k, lk in enumerate(logits[1:], 1):
            yk = L.extra_targets(y, k)
            nk = yk.numel()
            pred = lk.argmax(-1)
            add(f"loss_{k}", L.cross_entropy(lk, yk) * nk, nk)
            add(f"top1_{k}", (pred == yk).sum(), nk)
            add(f"agree_{k}", (pred == trunk_pred[:, k:]).sum(), nk)
        if on_batch is not None:
            on_batch()
    model.train(was_training)
    return {key: sums[key] / counts[key] for key in sums}


def _take(batches, n: int):
    """The first n windows of a stream of (x, y) batches."""
    for x, y in batches:
        if n <= 0:
            return
        yield x[:n], y[:n]
        n -= len(x)


def _windows(tokens: np.ndarray, context: int, limit: int | None) -> int:
    n = (len(tokens) - 1) // context
    return min(n, limit) if limit else n


def score_tokens(model: MTPModel, tokenizer, tokens: np.ndarray, limit: int | None = None, progress=None,
                 description: str = "heldout") -> dict:
    """Trunk loss / bpb / top-1 and per-extra metrics over the first `limit` context windows of `tokens`."""
    context = model.cfg.context
    n_windows = _windows(tokens, context, limit)
    if n_windows < 1:
        raise UserError(f"{description}: {len(tokens)} tokens are fewer than one window of context + 1 = {context + 1}")
    task = progress.add_task(description, total=math.ceil(n_windows / BATCH), info="") if progress else None
    window_losses: list[float] = []
    batches = _take(shards.val_batches(tokens, math.ceil(n_windows / BATCH), BATCH, context), n_windows)
    scores = evaluate(model, batches, device=next(model.parameters()).device, window_losses=window_losses,
                      on_batch=(lambda: progress.advance(task)) if progress else None)
    targets = np.asarray(tokens[1:1 + n_windows * context], dtype=np.int64)
    n_bytes = len(tokenizer.decode(targets.tolist(), skip_special_tokens=True).encode("utf-8"))
    windows = [{"window": w, "loss": loss, "tokens": context,
                "bytes": len(tokenizer.decode(targets[w * context:(w + 1) * context].tolist(),
                                              skip_special_tokens=True).encode("utf-8"))}
               for w, loss in enumerate(window_losses)]
    n_tokens = n_windows * context
    bits_per_token = 1 / math.log(2)
    lo, hi = stats.bootstrap_mean(window_losses)
    to_bpb = n_tokens * bits_per_token / max(n_bytes, 1)
    out = {"loss": scores["loss"], "loss_ci95": [lo, hi], "bpb": scores["loss"] * to_bpb,
           "bpb_ci95": [lo * to_bpb, hi * to_bpb], "top1": scores["top1"], "n": n_tokens, "n_windows": n_windows,
           "n_bytes": n_bytes, "context": context, "ci_method": "bootstrap over windows", "windows": windows}
    name = "depth" if model.objective == "sequential" else "head"
    extras = []
    for k in range(1, model.n_extra + 1):
        extras.append({"k": k, "name": f"{name} {k if name == 'depth' else k + 1}", "predicts": f"t+{k + 1}",
                       "loss": scores[f"loss_{k}"], "top1": scores[f"top1_{k}"], "agree": scores[f"agree_{k}"],
                       "n": n_windows * (context - k)})
    return out | {"extra": extras}


def report(run, limit: int | None = None, text: str | Path | None = None, progress=None) -> dict:
    """`results.heldout`: the validation split of the run's data (and `text`, if given)."""
    cfg = shards.comparison_config(run.recipe.data)
    data = shards.prepare(cfg, run.recipe.model.vocab_size) if cfg is not run.recipe.data else corpus.prepare_for(run.recipe)
    if toklib.fingerprint(data.tokenizer) != toklib.fingerprint(run.tokenizer):
        raise UserError(f"the validation split rebuilt from {run.run_dir}'s recipe uses a different tokenizer "
                        "than the run; held-out loss would be meaningless (use --text FILE)")
    out = score_tokens(run.model, run.tokenizer, data.val, limit, progress, "heldout: validation")
    out["source"] = f"validation split ({cfg.source}, val_fraction {cfg.val_fraction})"
    if cfg is run.recipe.data:  # a self-distilled run validated on its own text, not on these windows
        n_train = min(run.recipe.train.eval_batches * run.recipe.train.batch_size, out["n_windows"])
        first = [w["loss"] for w in out["windows"][:n_train]]
        out["train_val"] = {"windows": n_train, "loss": sum(first) / len(first),
                            "note": f"training's val_loss: the first eval_batches x batch_size = {n_train} of these "
                                    f"{out['n_windows']} windows"}
    if text is not None:
        ids = text_tokens(text, run.tokenizer, run.recipe.model.context)
        out["text"] = score_tokens(run.model, run.tokenizer, ids, limit, progress, f"heldout: {Path(text).name}") | {
            "source": str(Path(text).resolve())}
    return out


def text_tokens(text: str | Path, tokenizer, context: int) -> np.ndarray:
    """The tokens of `--text FILE`, refused in one line when unreadable or shorter than one window
    (checked by `mtp eval` before any other work)."""
    path = Path(text)
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read --text {path}: {exc}") from None
    ids = np.asarray(tokenizer(content, add_special_tokens=False).input_ids, dtype=np.int64)
    if len(ids) < context + 1:
        raise UserError(f"--text {path}: {len(ids)} tokens are fewer than one window of context + 1 = {context + 1}")
    return ids
