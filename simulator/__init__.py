"""The sensor fleet: snapshots, row updates, injected faults and a ledger of what was really sent."""

from simulator.config import DEFAULT_PRODUCER, FaultConfig, SimulatorConfig, SimulatorError, load_scenario
from simulator.ledger import LEDGER_SCHEMA
from simulator.producer import RunSummary, Simulator, SimulatorStats
from simulator.truth import SENSORS_SCHEMA, SESSIONS_SCHEMA, TABLES_SCHEMA

__all__ = [
    "DEFAULT_PRODUCER",
    "LEDGER_SCHEMA",
    "SENSORS_SCHEMA",
    "SESSIONS_SCHEMA",
    "TABLES_SCHEMA",
    "FaultConfig",
    "RunSummary",
    "Simulator",
    "SimulatorConfig",
    "SimulatorError",
    "SimulatorStats",
    "load_scenario",
]
