#!/bin/sh
# The network-partition faults (sotw/network/, tests/test_netns.py) drop packets between network namespaces
# with nftables. Install Debian's nftables package when `nft` is missing and this user may (root), waiting for
# another apt run's lock; otherwise say what to run. Never fails the set-up: without nft only the partition
# tests skip and the partition drills refuse to start, each saying why.
# A user's PATH may lack the sbin directories nft is installed in.
has_nft() { command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || [ -x /sbin/nft ]; }
has_nft && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "sotw: installing Debian's nftables for the network-partition drills (apt-get install nftables)" >&2
    if apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq nftables >/dev/null \
        && has_nft; then
        exit 0
    fi
    echo "sotw: apt-get install nftables failed; the network-partition tests skip until nft is on PATH." >&2
    exit 0
fi
echo "sotw: the network-partition drills need nft (nftables); as root run: apt-get install nftables" >&2
exit 0
