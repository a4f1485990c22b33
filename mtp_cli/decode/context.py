"""Keeping every eval inside the trained context, and saying how much of each prompt it cost.

A trunk trained at context C has never seen a position >= C, so no eval runs it there. The rule is
lm-eval's (HFLM): a generation keeps the rightmost `C - max_new_tokens` prompt tokens; a
teacher-forced score of prompt + continuation keeps the rightmost `C + 1` tokens (the inputs are
all but the last). With cutting off (`mtp eval --no-truncate`) an eval that would need a cut is
refused instead. `summary` is the per-task block that eval.json carries.
"""

from __future__ import annotations

from collections.abc import Sequence

from mtp_cli.base.errors import UserError

ALLOW_FLAG = "--no-truncate"  # the flag that switches cutting off; without it cutting is allowed


def generation_budget(max_new_tokens: int, context: int) -> int:
    """New tokens a generation may take: the task's budget, or half the context if that leaves no prompt room."""
    return max_new_tokens if max_new_tokens < context else max(1, context // 2)


def generation_cut(prompt_tokens: int, max_new_tokens: int, context: int) -> int:
    """Prompt tokens dropped from the left so that prompt + new tokens fit in the context."""
    return max(0, prompt_tokens + max_new_tokens - context)


def scoring_cut(prompt_tokens: int, continuation_tokens: int, context: int) -> int:
    """Prompt tokens dropped from the left so that the scored window (inputs: all but the last token) fits.
    One prompt token always stays: it predicts the first continuation token (a continuation longer than
    the context goes on in further windows, `lm.score_continuations`)."""
    return min(prompt_tokens - 1, max(0, prompt_tokens + continuation_tokens - (context + 1)))


def refuse(task: str, cuts: Sequence[int], prompt_lengths: Sequence[int], context: int, what: str) -> None:
    """Raise the one-line refusal when cutting is off and some prompt would need a cut."""
    n_cut = sum(c > 0 for c in cuts)
    if n_cut:
        raise UserError(f"{task}: {n_cut} of {len(cuts)} prompts ({what}) exceed the trained context {context} "
                        f"(longest prompt {max(prompt_lengths)} tokens); run without {ALLOW_FLAG} to keep the "
                        f"rightmost tokens of each prompt (lm-eval's rule), or train at a longer context")


def summary(cuts: Sequence[int], prompt_lengths: Sequence[int], context: int, over_context: int | None = None) -> dict:
    """eval.json's per-task context block. `over_context`: prompts that would have run past the context uncut."""
    cut = [c for c in cuts if c > 0]
    return {"context": context, "prompts_cut": len(cut), "prompt_cut_tokens_max": max(cut, default=0),
            "prompt_cut_tokens_mean": sum(cut) / len(cut) if cut else 0.0,
            "prompts_over_context": len(cut) if over_context is None else over_context,
            "prompt_tokens_max": max(prompt_lengths, default=0)}
