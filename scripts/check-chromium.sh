#!/bin/sh
# The browser test (tests/loadtest/test_locust_browser.py) drives Debian's Chromium through Playwright:
# Playwright's own browser download is not used. Install the Debian package when it is missing and this
# user may; otherwise say plainly what to run.
CHROMIUM=/usr/bin/chromium
if [ -x "$CHROMIUM" ]; then
    exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "sotw: installing Debian's chromium for the browser test (apt-get install chromium)" >&2
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    if [ -x "$CHROMIUM" ]; then
        exit 0
    fi
    echo "sotw: apt-get install chromium did not provide $CHROMIUM." >&2
    exit 3
fi
echo "sotw: the browser test needs Chromium at $CHROMIUM, and this user cannot install it." >&2
echo "      Run as root: apt-get install chromium   (then make setup again)" >&2
exit 3
