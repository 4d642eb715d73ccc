"""Bundles of Java libraries sotw runs, fetched from Maven Central by ``make setup``.

A bundle is a ``pom.xml`` (packaging ``pom``) in the repository's ``jars/<bundle>/`` listing what it needs:
``kafka`` is the Apache Kafka broker (``sotw.broker.kafka``). ``python -m sotw.jars fetch BUNDLE`` (a make
rule per bundle) has Maven copy the bundle's runtime dependencies into ``<environment>/jars/<bundle>/`` and
writes a manifest of what it copied; Maven keeps what it downloaded in ``~/.m2``, and make re-runs the rule
only when the bundle's ``pom.xml`` changed, so a second set-up neither downloads nor copies anything.
``classpath(BUNDLE)`` returns the jars after checking them against the manifest, so a missing, partly copied
or outdated bundle is named with its fix (``make setup``) instead of failing inside the JVM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sotw.errors import SetupError, SotwError

#: The repository's bundle definitions: ``jars/<bundle>/pom.xml``.
DEFINITIONS = Path(__file__).resolve().parent.parent / "jars"
MANIFEST = "manifest.json"


def bundle_dir(bundle: str, prefix: Path | None = None) -> Path:
    """Where ``bundle``'s jars are copied: ``jars/<bundle>`` in the environment ``prefix`` (this one)."""
    return Path(sys.prefix if prefix is None else prefix) / "jars" / bundle


def _pom(bundle: str) -> Path:
    pom = DEFINITIONS / bundle / "pom.xml"
    if not pom.is_file():
        known = sorted(p.parent.name for p in DEFINITIONS.glob("*/pom.xml"))
        raise SetupError(f"no bundle of jars named {bundle!r} (known: {', '.join(known) or 'none'})")
    return pom


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch(bundle: str, prefix: Path | None = None, mvn: str = "mvn") -> Path:
    """Copy ``bundle``'s runtime jars into its directory with Maven, replacing what was there.

    The jars go to a fresh directory beside the target first and replace it only once Maven succeeded and
    the manifest is written, so an interrupted fetch leaves the old bundle (or none), never half of one.

    Raises
    ------
    SetupError
        If Maven is missing or fails (its last output lines are in the message).
    """
    pom = _pom(bundle)
    target = bundle_dir(bundle, prefix)
    exe = shutil.which(mvn)
    if exe is None:
        raise SetupError(
            f"Maven ({mvn}) is needed to fetch the {bundle} jars and is not on PATH; "
            "install it (Debian: apt-get install maven) and run `make setup` again"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{bundle}-", dir=target.parent))
    try:
        done = subprocess.run(
            [
                exe,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging}",
            ],  # fmt: skip
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise SetupError(
                f"Maven could not fetch the {bundle} jars (exit code {done.returncode}):\n{tail}"
            )
        jars = {p.name: p.stat().st_size for p in sorted(staging.glob("*.jar"))}
        if not jars:
            raise SetupError(f"Maven copied no jars for the {bundle} bundle from {pom}")
        manifest = {"bundle": bundle, "pom_sha256": _digest(pom), "jars": jars}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def classpath(bundle: str, prefix: Path | None = None) -> list[Path]:
    """The jars of ``bundle``, checked against the manifest ``fetch`` wrote.

    Raises
    ------
    SetupError
        Naming ``make setup`` if the bundle was never fetched, a jar is missing or of another size than
        Maven copied (a truncated or replaced file), or the bundle's ``pom.xml`` changed since.
    """
    # A sotw installed from a wheel (the Docker image) has no jars/ beside it: its bundles were fetched from
    # the source tree at build time, and there is no newer pom.xml to be outdated against.
    pom = _pom(bundle) if DEFINITIONS.is_dir() else None
    folder = bundle_dir(bundle, prefix)
    fix = "run `make setup` to fetch them"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise SetupError(f"the {bundle} jars are not installed in {folder}: {fix}") from None
    except (OSError, ValueError) as exc:
        raise SetupError(
            f"the {bundle} jars' manifest {folder / MANIFEST} is unreadable ({exc}): {fix}"
        ) from None
    if pom is not None and manifest.get("pom_sha256") != _digest(pom):
        raise SetupError(f"the {bundle} jars in {folder} are from an older jars/{bundle}/pom.xml: {fix}")
    jars: list[Path] = []
    for name, size in manifest["jars"].items():
        path = folder / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            state = "missing" if actual is None else f"{actual:,} bytes, not {size:,}"
            raise SetupError(f"the {bundle} jars in {folder} are damaged ({name} is {state}): {fix}")
        jars.append(path)
    return jars


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m sotw.jars fetch BUNDLE...`` (make setup) or ``classpath BUNDLE...``."""
    parser = argparse.ArgumentParser(prog="python -m sotw.jars", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("fetch", "classpath"))
    parser.add_argument("bundles", nargs="+", metavar="BUNDLE")
    args = parser.parse_args(argv)
    try:
        for bundle in args.bundles:
            if args.action == "fetch":
                folder = fetch(bundle)
                jars = list(folder.glob("*.jar"))
                size = sum(p.stat().st_size for p in jars)
                print(f"{bundle} jars: {len(jars)} files, {size / 2**20:.0f} MiB in {folder}")
            else:
                print(":".join(str(p) for p in classpath(bundle)))
    except SotwError as exc:
        print(f"sotw jars: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
