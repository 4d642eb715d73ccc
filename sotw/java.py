"""The Java runtime sotw starts JVMs with (Apache Kafka's broker), checked before it is used.

A missing or too old ``java`` would otherwise show as a broker that exits at once with a class-file error deep
in its log; checking first names the fix.
"""

from __future__ import annotations

import re
import shutil
import subprocess

from sotw.errors import SetupError

#: Apache Kafka 4.x brokers (and PySpark 4) need Java 17 or newer.
MIN_JAVA = 17


def java_major(version_text: str) -> int | None:
    """The major version in ``java -version``'s output (``"17.0.15"``: 17, ``"1.8.0_292"``: 8), or None."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', version_text)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def find_java(java: str = "java", minimum: int = MIN_JAVA) -> str:
    """The absolute path of ``java`` after checking that it runs and is at least ``minimum``.

    Raises
    ------
    SetupError
        If ``java`` is not found, does not run, or is older than ``minimum``, naming how to install one.
    """
    install = f"install Java {minimum} or newer (Debian: apt-get install openjdk-{minimum}-jre-headless)"
    path = shutil.which(java)
    if path is None:
        raise SetupError(f"no Java runtime: {java!r} is not on PATH; {install}")
    try:
        done = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{path} -version failed ({exc}); {install}") from None
    major = java_major(done.stderr + done.stdout)
    if major is None:
        raise SetupError(f"{path} -version did not say which Java it is; {install}")
    if major < minimum:
        raise SetupError(f"{path} is Java {major}; Apache Kafka needs Java {minimum} or newer: {install}")
    return path
