"""The process torchrun starts on every GPU of a training job: `python -m mtp_cli.launch.worker CELL.json`.

It runs the cell's train stage as `mtp ablate` under torchrun does (all ranks train, rank 0 writes),
then exits 0, 1 (the stage crashed: the traceback is in the run's ablate.log) or 2 (bad input).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(spec_path: str) -> int:
    # imported when the job runs, as in launch.submit: jobs imports submitit, an optional dependency
    from mtp_cli.base.errors import UserError
    from mtp_cli.launch.jobs import StageFailed, run_stages

    try:
        run_stages(json.loads(Path(spec_path).read_text()), ("train",))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except StageFailed as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
