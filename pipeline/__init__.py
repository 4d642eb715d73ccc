"""The PySpark Structured Streaming pipeline that rebuilds every capture session's table."""
