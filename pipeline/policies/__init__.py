"""Integrity policies: which guarantee a run enforces on every session's stream, and how each one does it.

Each policy is one class of stream integrity (see ``docs/pipeline.md``), one module each:

* ``strict`` (``Strict``): in order, nothing skipped; anything else stops the query;
* ``ordered`` (``Ordered``): in order, skips and repeats tolerated and recorded;
* ``once`` (``Once``): any order, nothing skipped or repeated;
* ``window`` (``Window``): out of order within a bounded lateness;
* ``none`` (``NoIntegrity``): everything applied, anomalies only counted.

``base.Policy`` holds what they share, ``config.PolicyConfig`` a run's choice and settings, and ``policy_for``
picks the class a ``PolicyConfig`` names. ``pipeline.processor.SessionProcessor`` runs the chosen one.
"""

from pipeline.policies.base import Policy
from pipeline.policies.config import POLICIES, PolicyConfig
from pipeline.policies.none import NoIntegrity
from pipeline.policies.once import Once
from pipeline.policies.ordered import Ordered
from pipeline.policies.strict import Strict
from pipeline.policies.window import Window

POLICY_CLASSES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Strict, Ordered, Once, Window, NoIntegrity)
}
"""The class of each policy name in ``POLICIES``."""


def policy_for(config: PolicyConfig) -> Policy:
    """The policy ``config`` names, with its settings."""
    return POLICY_CLASSES[config.policy](config)


__all__ = [
    "POLICIES",
    "POLICY_CLASSES",
    "NoIntegrity",
    "Once",
    "Ordered",
    "Policy",
    "PolicyConfig",
    "Strict",
    "Window",
    "policy_for",
]
