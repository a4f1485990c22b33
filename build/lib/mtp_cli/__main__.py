"""Entry point for `python -m mtp_cli` (and `torchrun -m mtp_cli train ...`)."""

from mtp_cli.cli import main

main()
