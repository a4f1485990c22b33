"""The functions `humaneval_local.yaml` names: lm-eval imports this file from the task's folder."""

from mtp_cli.evals.lm_eval_hf import completions, passed

__all__ = ["completions", "passed"]
