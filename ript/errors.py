class RiptError(Exception):
    """A user-facing error: the CLI prints its one-line message and exits non-zero."""
