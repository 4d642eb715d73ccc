"""What the broker lost of what it had acknowledged, from the ledger alone.

A partition's offsets start again lower when the broker loses acknowledged records (its log wiped, a topic
recreated, an out-of-sync replica elected leader). ``partition_lives`` numbers each copy's life in its
partition; ``overwritten`` and ``beyond_end`` find the copies the broker no longer has, and ``reissued`` those
acknowledged at an offset given out before, which a reader already past it never sees.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from loadtest.correctness.delivery import acknowledged


def partition_lives(ledger: pd.DataFrame) -> pd.Series:
    """Each delivered copy's ``life`` in its partition: how many times its offsets had started again lower.

    A partition's offsets start again from a lower number when the broker lost what it had acknowledged (its
    data wiped, a topic recreated, an out-of-sync replica elected leader): what was acknowledged after such
    a reset comes after everything before it, although its offsets are lower. Acknowledgements of one
    partition arrive in offset order, so in acknowledgement order an offset below one already seen marks the
    reset. Counted over every session's copies of the partition, so a session that began after the reset is
    in the later life too. NaN for copies without an offset.
    """
    copies = ledger[acknowledged(ledger) & ledger["offset"].notna()]
    if copies.empty:
        return pd.Series(index=ledger.index, dtype="float64")
    order = (
        ["topic", "partition", "acked_ts", "offset"]
        if "acked_ts" in copies
        else ["topic", "partition", "offset"]
    )
    acked = copies.sort_values(order)
    keys = [acked["topic"], acked["partition"]]
    # Each step down starts a life; a running maximum would count every copy after the first step as one.
    previous = acked.groupby(keys)["offset"].shift()
    life = (acked["offset"] < previous).astype(int).groupby(keys).cumsum()
    return life.reindex(ledger.index).astype("float64")


def overwritten(ledger: pd.DataFrame, lives: pd.Series) -> pd.DataFrame:
    """Acknowledged copies the broker no longer has: at or above an offset its partition later started again at.

    When a partition's offsets start again lower (``partition_lives``: its data wiped, an out-of-sync
    replica elected leader), the records acknowledged before at the offsets it numbers anew are gone from the
    broker, whether or not a consumer read them first. The frame is those copies (the ledger's columns) with
    ``restart``, the lowest offset a later life of their partition began at.
    """
    copies = ledger.assign(life=lives)[lives.notna()]
    if copies.empty or int(copies["life"].max()) == 0:
        return ledger.iloc[0:0].assign(restart=pd.Series(dtype="int64"))
    keys = ["topic", "partition"]
    starts = copies.groupby([*keys, "life"])["offset"].min().reset_index()
    later = []
    for (topic, partition), lives_of in starts.groupby(keys):
        ordered = lives_of.sort_values("life")
        # The lowest start of any later life: a copy at or above it was numbered anew.
        after = ordered["offset"][::-1].cummin()[::-1].shift(-1)
        later.append(
            pd.DataFrame({"topic": topic, "partition": partition, "life": ordered["life"], "restart": after})
        )
    bounds = pd.concat(later, ignore_index=True).dropna(subset=["restart"])
    merged = copies.reset_index().merge(bounds, on=[*keys, "life"])
    lost = merged[merged["offset"] >= merged["restart"]].set_index("index")
    return lost.drop(columns="life").assign(restart=lost["restart"].astype("int64"))


def beyond_end(ledger: pd.DataFrame, ends: Mapping[tuple[str, int], int]) -> pd.DataFrame:
    """Acknowledged copies at or past where their partition ends now: the broker no longer has them.

    After an unclean election or a wiped log, what the broker lost shows in the ledger alone only once new
    records are numbered over it (``overwritten``); a run that ends first (a strict pipeline stops at once,
    and the load with it) leaves the partition ending below offsets it acknowledged. The frame is those
    copies with ``restart``: where the partition ends, and ``seen`` = ``"end"``.
    """
    copies = ledger[acknowledged(ledger) & ledger["offset"].notna()]
    keys = list(zip(copies["topic"], copies["partition"].astype("int64"), strict=True))
    end = pd.Series([ends.get(k, -1) for k in keys], index=copies.index, dtype="int64")
    lost = copies[(end >= 0) & (copies["offset"] >= end)]
    return lost.assign(restart=end[lost.index], seen="end")


def reissued(ledger: pd.DataFrame, lives: pd.Series) -> pd.Series:
    """Whether each copy was acknowledged at an offset its partition had given out before, in an earlier life.

    After an unclean election the new leader numbers new records over offsets the old one had acknowledged;
    a reader already past them never sees the new records there, through no fault of its own.
    """
    copies = ledger.assign(life=lives)[lives.notna()]
    out = pd.Series(False, index=ledger.index)
    if copies.empty or int(copies["life"].max()) == 0:
        return out
    keys = ["topic", "partition"]
    highest = copies.groupby([*keys, "life"])["offset"].max().reset_index()
    # The highest offset of any earlier life of the partition.
    highest["before"] = highest.groupby(keys)["offset"].cummax().groupby([highest[k] for k in keys]).shift()
    merged = copies.reset_index().merge(highest[[*keys, "life", "before"]], on=[*keys, "life"])
    hit = merged.loc[merged["offset"] <= merged["before"], "index"]
    out.loc[hit] = True
    return out
