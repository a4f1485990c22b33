"""The lowest layer, imported by every other: errors and the CLI's exit codes, where files live and how they
are written and read back, the machine and torch runtime, terminal output, and the statistics and tables
that results share. Nothing here imports the rest of mtp_cli."""
