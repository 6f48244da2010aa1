"""The one error type a user's mistake raises: the CLI prints it as one line and exits 2."""


class UserError(Exception):
    """Something the user asked for that cannot be done; the CLI prints it as one line, exit 2."""
