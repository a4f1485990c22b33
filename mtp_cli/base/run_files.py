"""The names of the files and folders in a run folder, in one place: every writer and reader takes them
from here (a run folder is what `mtp train` makes and `mtp eval`, `mtp specbench` and `mtp report` read)."""

RUN_JSON = "run.json"  # the run's recipe, step and counters: a folder holding it is a run
CHECKPOINT = "checkpoint.pt"
SHARDED = "sharded"  # an FSDP run's distributed checkpoint (DCP), beside or instead of checkpoint.pt
TRAIN_LOCK = "train.lock"  # held (flock) by the one `mtp train` writing the run; holds its pid
METRICS = "metrics.jsonl"  # one line per logged training step and validation check
TOKENIZER = "tokenizer"
EXPORT = "export"  # the trunk as a Hugging Face checkpoint (MTP modules discarded)
EXPORT_INFO = "mtp_export.json"  # inside the export: which run, step and objective it came from
EVAL_JSON = "eval.json"
LM_EVAL_JSON = "eval_lm_eval.json"  # `mtp eval --hf SOURCE --harness lm-eval`: the same tasks through lm-eval's HF backend
SPEC_JSON = "specbench.json"
ABLATE_JSON = "ablate.json"  # `mtp ablate`'s record of the cell's stages
ABLATE_LOG = "ablate.log"  # a run's stage failures, with their tracebacks
# An evaluation's files (samples_path: <json stem>_<task>_<kind>.jsonl): what `mtp export --out --force` never deletes
EVAL_FILE_PATTERNS = ("eval*.json", SPEC_JSON, "*_samples.jsonl", "*_windows.jsonl", "*_gold.jsonl")
