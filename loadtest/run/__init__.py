"""One run of the whole system: its request and profile, the processes it starts, its lifecycle (``phases``), the stage incidents act on and the simulator's typed controls."""
