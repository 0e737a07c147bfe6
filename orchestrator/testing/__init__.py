"""The test kit: a private containerd, offline images, simulated nodes, the deterministic Raft
simulation and the linearizability checker. Used by the project's tests and benchmarks, and
usable by the tests of users' own controllers; nothing in the product imports it at run time
except the benchmark harness (`orchestrator bench`)."""
