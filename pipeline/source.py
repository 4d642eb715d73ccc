"""Kafka source for Spark as a Python data source (being written)."""
