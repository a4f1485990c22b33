"""GSM8K's text format, taken from lm-eval's own task YAML (`lm_eval/tasks/gsm8k/gsm8k.yaml`: its
`doc_to_text` template and target delimiter), so that specbench's GSM8K prompts, GSM8K training
documents and self-distillation prompts are the prompts lm-eval scores, written nowhere else. The
file is found without importing lm-eval (seconds of start-up) and rendered with Jinja, as lm-eval does."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import jinja2
import yaml

from mtp_cli.base.errors import UserError


@functools.cache
def _task() -> tuple[jinja2.Template, str]:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("GSM8K's prompt format comes from lm-eval's task YAML: pip install lm-eval")
    path = Path(spec.submodule_search_locations[0]) / "tasks" / "gsm8k" / "gsm8k.yaml"
    task = yaml.load(path.read_text(), Loader=_TolerantLoader)
    return jinja2.Template(task["doc_to_text"], keep_trailing_newline=True), task.get("target_delimiter", " ")


class _TolerantLoader(yaml.SafeLoader):
    """lm-eval's YAML may carry `!function module.name` tags; the text template does not need them."""


_TolerantLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def prompt(question: str) -> str:
    """The zero-shot prompt lm-eval's gsm8k task shows the model for this question."""
    return _task()[0].render(question=question)


def document(question: str, answer: str) -> str:
    """A worked example as lm-eval's few-shot context writes one: the prompt, the delimiter, the answer."""
    return prompt(question) + _task()[1] + answer
