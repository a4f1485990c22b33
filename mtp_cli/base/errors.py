"""The exceptions the CLI turns into its exit codes: bad user input (a one-line error, exit 2) and a
SIGTERM (handled as Ctrl-C is, exit 143), and whether the command already said why it stopped."""


class UserError(Exception):
    """Input the user can fix (bad flag, bad recipe, missing file). Message is one line."""


class Terminated(BaseException):
    """SIGTERM (Slurm, systemd, `timeout`), raised where Ctrl-C's KeyboardInterrupt would be, so that the
    same clean-up runs; the CLI exits 143 (128 + 15). Not a KeyboardInterrupt: typer turns those into a
    bare exit code 130."""


def raise_terminated(signum, frame) -> None:
    """A SIGTERM handler: the signal as an exception."""
    raise Terminated()


class Stop:
    """Whether the command has said, in its own line, why it stopped (Ctrl-C or SIGTERM); if not, the CLI
    says "interrupted" or "terminated"."""
    said = False
