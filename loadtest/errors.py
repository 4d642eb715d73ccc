"""The load-test harness's expected failures: one exception type for the whole package."""

from sotw.errors import SotwError


class HarnessError(SotwError):
    """A load-test part failed, or an input or output is missing or invalid; the message says which."""
