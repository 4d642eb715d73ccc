#!/bin/sh
# PySpark needs a Java 17+ runtime; say so plainly instead of failing deep inside Spark start-up.
if ! command -v java >/dev/null 2>&1; then
    echo "sotw: Java 17 or newer is required by PySpark, and no 'java' is on PATH." >&2
    echo "      Install it (Debian: apt-get install openjdk-17-jre-headless) and try again." >&2
    exit 3
fi
major=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}' | cut -d. -f1)
if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    echo "sotw: Java 17 or newer is required by PySpark; found version '${major:-unknown}'." >&2
    exit 3
fi
