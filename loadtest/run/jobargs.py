"""The command-line flags ``sotw run`` and ``sotw locust`` share, defined once: the job under test, the verdict's floor.

``sotw run``, ``bench``, ``capacity`` and ``drill`` (``loadtest.cli``) add them to their parsers, and the
locustfile adds them to Locust's (``loadtest/locust/locustfile.py``), so both name and explain them alike and
turn them into the same ``loadtest.run.job.JobSpec``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadtest.correctness.outputspec import CONTRACTS, FORMATS
from loadtest.errors import HarnessError
from loadtest.run.job import JobSpec, LagFrom
from loadtest.run.processes import PLACEHOLDERS
from pipeline.config import SOURCES


def add_job_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The flags that choose the job under test and how its output is read (``loadtest.run.job``); their group.

    In Locust's parser they stay out of the web UI's start form: only the parser's own ``add_argument`` puts
    an option there.
    """
    g = p.add_argument_group(
        "the job under test (default: sotw pipeline; see docs/own-pipeline.md)",
    )
    g.add_argument(
        "--pipeline-cmd",
        default=None,
        metavar="TEMPLATE",
        help="start this command instead of sotw pipeline, e.g. 'spark-submit job.py --bootstrap {bootstrap} "
        "--topics {pattern} --out {output} --checkpoint {checkpoint}'; placeholders: "
        + ", ".join("{" + k + "}" for k in PLACEHOLDERS),
    )
    g.add_argument(
        "--attach",
        action="store_true",
        help="verify a job that is already running (needs --output and --lag-from)",
    )
    g.add_argument("--output", type=Path, default=None, help="--attach: where the job writes")
    g.add_argument(
        "--lag-from",
        default=None,
        metavar="SOURCE",
        help="checkpoint:PATH (a Spark checkpoint) or group:ID (a consumer group's committed offsets); "
        "default: the {checkpoint} the template was given; --attach needs it",
    )
    g.add_argument(
        "--contract", choices=CONTRACTS, default="full", help="output contract the verifier reads (full)"
    )
    g.add_argument(
        "--format",
        dest="output_format",
        choices=FORMATS,
        default="auto",
        help="output format (auto: detected); topic: the job writes its table to a Kafka topic "
        "(tables contract), {output_topic}",
    )
    g.add_argument(
        "--output-topic",
        default=None,
        metavar="NAME",
        help="--format topic: the topic the job writes to (default: named after the run, "
        "<prefix without its last '-'>.tables, given as {output_topic} and deleted by --cleanup)",
    )
    g.add_argument(
        "--ignore-column",
        dest="ignore_columns",
        action="append",
        default=[],
        metavar="NAME",
        help="tables contract: a column of the job's table that is not one of the rows' (repeatable)",
    )
    return g


def job_from_args(args: argparse.Namespace) -> JobSpec | None:
    """The ``JobSpec`` the flags describe; None for sotw's own pipeline with its defaults.

    Raises
    ------
    HarnessError
        If the flags do not make a job (``--output`` without ``--attach``, a bad template, ...).
    """
    if (
        args.pipeline_cmd is None
        and not args.attach
        and args.output is None
        and args.lag_from is None
        and args.contract == "full"
        and args.output_format == "auto"
        and not args.ignore_columns
        and args.output_topic is None
    ):
        return None
    if args.output is not None and not args.attach:
        raise HarnessError(
            "--output is for --attach; a --pipeline-cmd job writes to {output} in the run directory"
        )
    return JobSpec(
        command=args.pipeline_cmd,
        attach=args.attach,
        output=args.output,
        lag_from=LagFrom.parse(args.lag_from) if args.lag_from else None,
        contract=args.contract,
        format=args.output_format,
        ignore_columns=tuple(args.ignore_columns),
        output_topic=args.output_topic,
    )


def add_source_arg(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--source``: which Kafka reader sotw's own pipeline uses (the profile's ``pipeline.source``)."""
    p.add_argument(
        "--source",
        choices=SOURCES,
        default=None,
        help="Kafka reader of sotw's pipeline under test: Spark's own connector or sotw's Python data source "
        "(default: the profile's, else the pipeline's default)",
    )


def add_min_judged(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--min-judged``: the share of sessions a verdict needs judged (``RunSettings.min_judged``)."""
    p.add_argument(
        "--min-judged",
        type=float,
        default=None,
        metavar="SHARE",
        help="the share of sessions the verifier must judge for a PASS, below it INCONCLUSIVE "
        "(default: the profile's run.min_judged, 0.9)",
    )
