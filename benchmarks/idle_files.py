"""Files an idle pipeline leaves behind: output and checkpoint file counts over a quiet stretch.

With a session timeout Spark runs a micro-batch every trigger even when no data arrives. This benchmark starts
a local Kafka broker and ``sotw pipeline`` (1 s trigger), gives it a few sessions to hold, then lets it idle
and counts the files under its output and checkpoint, and the progress log's lines, every ``--every``
seconds. A bounded pipeline adds nothing per idle hour once the retained batches are full (Spark keeps the
last 100 batches of its checkpoint, sotw the last 100 markers of batches that wrote nothing).

    .venv/bin/python benchmarks/idle_files.py --minutes 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from sotw.broker import KafkaBroker
from sotw.kafka import KafkaConfig, ensure_topics
from sotw.wire import encode_snapshot


def count_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="idle time measured (10)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between counts (30)")
    p.add_argument("--json", type=Path, default=None, help="also write the samples here")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sotw-idle-"))
    with KafkaBroker(log_path=work / "broker.log") as broker:
        kafka = KafkaConfig(broker.bootstrap)
        topic = "idle-sensor-0001"
        ensure_topics(kafka, {topic: 1})
        producer = Producer(kafka.client())
        rows = [{"id": i, "temp": 20.0} for i in range(10)]
        for k in range(3):  # sessions left open, so the state holds something while idle
            producer.produce(
                topic, key=f"s{k}".encode(), value=encode_snapshot("sensor-0001", f"s{k}", 0, 0, rows)
            )
        producer.flush(10)
        del producer  # before the broker stops, so the client does not log the disconnection
        output, checkpoint = work / "output", work / "checkpoint"
        argv = [
            sys.executable, "-m", "sotw", "pipeline", "--bootstrap", kafka.bootstrap, "--pattern", "idle-.*",
            "--trigger", "1s", "--session-timeout", "1h", "--output", str(output), "--checkpoint", str(checkpoint),
            "-q",
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(work / "pipeline.log").open("wb"))
        samples = []
        try:
            start = time.monotonic()
            while time.monotonic() - start < args.minutes * 60:
                time.sleep(args.every)
                if proc.poll() is not None:
                    raise SystemExit(
                        f"the pipeline exited with {proc.returncode}; see {work / 'pipeline.log'}"
                    )
                progress = output / "progress.jsonl"
                sample = {
                    "minutes": round((time.monotonic() - start) / 60, 2),
                    "batches": len(list((checkpoint / "commits").glob("[0-9]*")))
                    and max(int(c.name) for c in (checkpoint / "commits").glob("[0-9]*")),
                    "output_files": count_files(output),
                    "checkpoint_files": count_files(checkpoint),
                    "progress_lines": len(progress.read_text().splitlines()) if progress.exists() else 0,
                }
                samples.append(sample)
                print(
                    f"{sample['minutes']:6.2f} min  batches {sample['batches']:5}  output files "
                    f"{sample['output_files']:5}  checkpoint files {sample['checkpoint_files']:5}  "
                    f"progress lines {sample['progress_lines']:5}",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(60)
    half = [s for s in samples if s["minutes"] >= args.minutes / 2]
    if len(half) >= 2:
        hours = (half[-1]["minutes"] - half[0]["minutes"]) / 60
        for key in ("output_files", "checkpoint_files", "progress_lines"):
            growth = (half[-1][key] - half[0][key]) / hours if hours else float("nan")
            print(f"{key} per idle hour (second half of the run): {growth:+,.0f}")
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
