"""The load-test harness: runs at 1x and 10x, measurements, the correctness verdict and the report."""
