"""The error a stage prints as it is: below every phase, so any of them can raise it."""


class StageError(Exception):
    """A failure whose message is complete for a person (what failed, and what to do about it);
    the stage prints it as one `error:` line. Raise it (or a subclass) for failures that are not
    a bad value (ValueError) or a missing file (FileNotFoundError)."""
