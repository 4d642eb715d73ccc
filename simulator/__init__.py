"""The sensor fleet: snapshots, row updates, injected faults and a ledger of what was really sent."""
