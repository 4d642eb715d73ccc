"""The PySpark Structured Streaming pipeline that rebuilds every capture session's table.

``pipeline.query.run(spark, PipelineConfig(...))`` runs it; ``sotw pipeline`` is its command line.
"""

from pipeline.config import PipelineConfig
from pipeline.errors import IntegrityStopped, IntegrityViolation, PipelineError
from pipeline.policies import POLICIES, PolicyConfig
from pipeline.spark import SparkConfig, build_session

__all__ = [
    "POLICIES",
    "IntegrityStopped",
    "IntegrityViolation",
    "PipelineConfig",
    "PipelineError",
    "PolicyConfig",
    "SparkConfig",
    "build_session",
]
