"""The one exception type the CLI turns into a single readable line instead of a traceback."""


class UserError(Exception):
    """Something the user can fix: the message says what was wrong, where, and how to fix it."""
