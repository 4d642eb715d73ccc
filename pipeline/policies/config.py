"""A run's integrity policy and its settings: which guarantee it enforces on every session's stream.

``PolicyConfig`` names one of ``POLICIES`` and carries the session timeout and the window's lateness; the
rules of each policy are a class of their own beside this module (``pipeline.policies.policy_for`` picks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError

POLICIES = ("strict", "ordered", "once", "window", "none")


@dataclass(frozen=True)
class PolicyConfig:
    """How the stateful step judges each session's stream.

    Parameters
    ----------
    policy
        One of ``strict``, ``ordered``, ``once``, ``window``, ``none``.
    session_timeout_ms
        A session with no message for this long (processing time) is closed as ``timed_out``; a closed
        session's small marker is kept this long too, so late duplicates are recognised. Default: one hour.
    window_messages
        ``window`` only: a hole in the seqs is given up (recorded as a gap) once more than this many later
        messages are held back behind it.
    window_ms
        ``window`` only: a hole is given up once the newest message's event time (``ts``) is more than this
        many ms past the first message held back behind it.
    max_buffer
        Hard bound of the reorder buffer per session, whatever the lateness, so state stays bounded.
    """

    policy: str = "ordered"
    session_timeout_ms: int = 3_600_000
    window_messages: int | None = None
    window_ms: int | None = None
    max_buffer: int = 10_000

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.session_timeout_ms <= 0:
            raise ConfigError(f"session_timeout_ms must be positive, got {self.session_timeout_ms}")
        for name in ("window_messages", "window_ms"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.policy != "window":
                raise ConfigError(
                    f"{name} only applies to the window policy, got {name}={value} with {self.policy}"
                )
            if value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        if self.policy == "window" and self.window_messages is None and self.window_ms is None:
            raise ConfigError("the window policy needs a lateness: set window_messages and/or window_ms")
        if self.max_buffer < 1:
            raise ConfigError(f"max_buffer must be at least 1, got {self.max_buffer}")
