"""The source's data-loss judgements on their own: the driver's view of partitions, a reader's stalled one."""

from __future__ import annotations

import logging
import time

import pytest

from pipeline.source import DataLossError, SourceOptions, SourceTimeoutError
from pipeline.source.broker import GONE, UNKNOWN, BrokerView
from pipeline.source.dataloss import (
    DIVERGENCE_MARGIN_MS,
    FINISH,
    WAIT,
    LossDetector,
    StallVerdict,
    judge_stall,
)

TP = ("sensor-7", 0)


def options(fail: bool = True, poll_ms: int = 120_000) -> SourceOptions:
    return SourceOptions.from_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "subscribe": TP[0],
            "failOnDataLoss": str(fail).lower(),
            "kafkaConsumer.pollTimeoutMs": str(poll_ms),
        }
    )


def test_a_deleted_partition_stops_the_reader_naming_the_offsets_it_still_had_to_read() -> None:
    with pytest.raises(DataLossError, match=r"topic 'sensor-7' partition 0 offsets \[200, 500\) .* deleted"):
        judge_stall(options(), TP, 200, 500, GONE, quiet_s=3.0)


def test_without_fail_on_data_loss_the_reader_warns_and_goes_on_from_what_exists(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert judge_stall(options(fail=False), TP, 200, 500, GONE, quiet_s=3.0) == FINISH
        assert judge_stall(options(fail=False), TP, 200, 500, (300, 900), 3.0) == StallVerdict(resume_at=300)
        assert judge_stall(options(fail=False), TP, 200, 500, (600, 900), 3.0) == FINISH
        assert judge_stall(options(fail=False), TP, 200, 500, (0, 400), 3.0) == StallVerdict(end_at=400)
        assert judge_stall(options(fail=False), TP, 200, 500, (0, 150), 3.0) == FINISH
    lost = [r.getMessage() for r in caplog.records]
    assert [m.split(" are no longer")[0].split("partition 0 ")[1] for m in lost] == [
        "offsets [200, 500)",
        "offsets [200, 300)",
        "offsets [200, 500)",
        "offsets [400, 500)",
        "offsets [200, 500)",
    ]


def test_a_broker_that_does_not_answer_is_waited_for_up_to_the_poll_timeout_never_taken_for_loss() -> None:
    assert judge_stall(options(poll_ms=5_000), TP, 200, 500, UNKNOWN, quiet_s=4.0) == WAIT
    with pytest.raises(SourceTimeoutError, match="did not answer whether they exist"):
        judge_stall(options(poll_ms=5_000), TP, 200, 500, UNKNOWN, quiet_s=6.0)


def test_records_that_exist_but_do_not_come_time_out_the_reader() -> None:
    assert judge_stall(options(poll_ms=5_000), TP, 200, 500, (0, 900), quiet_s=4.0) == WAIT
    with pytest.raises(SourceTimeoutError, match="although the broker has offsets up to 900"):
        judge_stall(options(poll_ms=5_000), TP, 200, 500, (0, 900), quiet_s=6.0)


def view(
    available: dict[tuple[str, int], tuple[int, int]], gone: set[tuple[str, int]] | None = None
) -> BrokerView:
    return BrokerView(available=available, gone=gone or set())


def test_the_driver_reads_on_from_where_it_is_and_a_new_partition_from_its_earliest_offset() -> None:
    detector = LossDetector(fail=True)
    first = view({TP: (0, 500)})
    detector.remember(first)
    end, origin = detector.resume({TP: 300}, view({TP: (0, 800), ("sensor-8", 0): (40, 90)}))
    assert end == {TP: 800, ("sensor-8", 0): 90}
    assert origin == {TP: 300, ("sensor-8", 0): 40}


def test_a_partition_reset_under_the_query_is_loss_of_what_it_had_seen_and_not_read() -> None:
    detector = LossDetector(fail=True)
    detector.remember(view({TP: (0, 500)}))
    with pytest.raises(DataLossError, match=r"offsets \[300, 500\) .* reset and now ends at 20"):
        detector.resume({TP: 300}, view({TP: (0, 20)}))


def test_a_truncated_partition_is_read_on_from_its_first_record_since_the_last_look_not_from_its_start() -> (
    None
):
    asked: list[tuple[tuple[str, int], int]] = []

    def first_since(tp: tuple[str, int], ms: int) -> int:
        asked.append((tp, ms))
        return 260  # the new leader's log parts from the old one here

    detector = LossDetector(fail=False, first_since=first_since)
    detector.remember(view({TP: (0, 500)}))
    end, origin = detector.resume({TP: 300}, view({TP: (0, 280)}))
    assert end == {TP: 280} and origin == {TP: 260}
    ((tp, ms),) = asked
    assert tp == TP and abs(ms - (time.time() * 1000 - DIVERGENCE_MARGIN_MS)) < 5000


def test_a_truncated_partition_the_broker_cannot_place_is_read_again_from_its_earliest_offset() -> None:
    detector = LossDetector(fail=False, first_since=lambda tp, ms: None)
    detector.remember(view({TP: (40, 500)}))
    assert detector.resume({TP: 300}, view({TP: (40, 280)})) == ({TP: 280}, {TP: 40})


def test_a_partition_that_vanished_after_it_was_read_and_came_back_lower_is_loss_from_where_it_was() -> None:
    detector = LossDetector(fail=True)
    detector.remember(view({TP: (0, 500)}))
    end, _ = detector.resume({TP: 500}, view({}, gone={TP}))  # read to its end, then deleted: no loss
    assert end == {}
    with pytest.raises(DataLossError, match="offsets from 500 on .* came back starting at 0"):
        detector.resume({}, view({TP: (0, 30)}))


def test_a_partition_listed_nowhere_this_time_keeps_its_position() -> None:
    detector = LossDetector(fail=True)
    assert detector.resume({TP: 300}, view({})) == ({TP: 300}, {TP: 300})
