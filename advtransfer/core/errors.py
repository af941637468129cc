"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (unknown name, malformed file, missing data...).

    The message must say what is wrong and what to do about it, on one line.
    """

    exit_code = 2
