#!/bin/sh
# The Locust web UI's browser test (tests/loadtest/test_locust_browser.py) drives Debian's Chromium through
# Playwright; Playwright's own browser download is not used. Install the Debian package when it is missing and
# this user may (root), waiting for another apt run's lock; otherwise say what to run. Never fails the set-up:
# without Chromium only the browser test fails, and it says why.
CHROMIUM=/usr/bin/chromium
[ -x "$CHROMIUM" ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "sotw: installing Debian's chromium for the browser test (apt-get install chromium)" >&2
    if apt-get -o DPkg::Lock::Timeout=300 update -qq >/dev/null \
        && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium >/dev/null \
        && [ -x "$CHROMIUM" ]; then
        exit 0
    fi
    echo "sotw: apt-get install chromium failed; the browser test will fail until $CHROMIUM exists." >&2
    exit 0
fi
echo "sotw: the browser test needs Chromium at $CHROMIUM; as root run: apt-get install chromium" >&2
exit 0
