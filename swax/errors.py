"""Exceptions for user errors: the CLI prints them as one line and exits non-zero."""


class SwaxError(Exception):
    """A user error (bad input, bad file, bad config): printed as one line, no traceback."""


class ConfigError(SwaxError, ValueError):
    """An invalid configuration value, unknown key or wrong type; the message names the key."""


class CheckpointError(SwaxError):
    """A missing, corrupt or mismatched checkpoint; the message names the file."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint or model file that cannot be read back as written (bad checksum, truncated
    or unparsable file); resuming falls back to the checkpoint before it."""
