"""Built-in benchmarks (`orchestrator bench ...`): whole-system measurements in one process."""
