"""Raft consensus: a sans-IO core, SQLite storage, a TCP peer transport and a trio driver."""
