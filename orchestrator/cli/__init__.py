"""The `orchestrator` command line: argument parsing and output for people."""
