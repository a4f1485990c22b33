"""The one exception type for bad user input: the CLI turns it into a one-line error and exit code 2."""


class UserError(Exception):
    """Input the user can fix (bad flag, bad recipe, missing file). Message is one line."""
