"""The nightly gate: candidate and baseline measured side by side (``nightly``, ``sidebyside``, ``paired``), its history and trend page (``history``, ``trend``)."""
