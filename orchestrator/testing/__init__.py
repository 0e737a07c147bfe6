"""The test kit: what the project's own tests and benchmarks use, and what the tests of users'
own controllers can use (as `trio.testing` is to trio). Nothing in the product imports it at run
time except the benchmark harness (`orchestrator bench`).

* `apiserver` — `api_server()`: the real server in this process (one Raft member on a temporary
  SQLite store, HTTPS on loopback, controllers on or off, optionally the embedded node agent),
  with an admin `httpx` client, the admin `kubeconfig` and the in-process `Api`. No fake: a
  test sees the real validation, defaulting, patch and resourceVersion behaviour.
* `nodes` — `SimulatedNode` / `SimulatedCluster`: node agents that register, heartbeat (Lease
  and status) and report bound pods Running without running anything (as kwok does); one pod
  watch, one timer and a pool of writers for any number of nodes; partitions with
  `stop_heartbeats()` / `resume_heartbeats()`.
* `containerd` — `ContainerdInstance`: a private containerd under one directory (its own
  socket, state, CNI bridge and IP range), started and stopped by a test or a benchmark, next to
  any system containerd; `python -m orchestrator.testing.containerd` runs one for a developer.
  `images` builds the offline images it imports (`localhost/busybox:1`, `localhost/pause:1`);
  `crisweep` removes every pod sandbox at teardown.
* `linearizability` — `check_history()`: a linearizability checker for key-value histories
  (Wing & Gong / Lowe search, Porcupine-style; `linsearch` is its per-key search engine).
* `raft_sim` and `machines` — the seeded, deterministic whole-cluster Raft simulation and the
  state machines it drives.
* `faults` — the fault injector for the Raft transport (drop, delay, partition).

Example, a controller's test with pytest-trio (the server's own controllers and scheduler run;
the Deployment `WEB`'s two pods land on three simulated nodes)::

    import trio
    from orchestrator.testing.apiserver import api_server
    from orchestrator.testing.nodes import SimulatedCluster

    async def test_pods_run_on_simulated_nodes() -> None:
        async with api_server() as h, trio.open_nursery() as nursery:
            await h.wait_namespace("kube-node-lease")  # the nodes' Leases live there
            await nursery.start(SimulatedCluster(h.api, 3).run)  # three Ready nodes
            r = await h.client.post("/apis/apps/v1/namespaces/default/deployments", json=WEB)
            assert r.status_code == 201, r.text
            with trio.fail_after(30):  # poll the pods until both run
                while True:
                    r = await h.client.get("/api/v1/namespaces/default/pods")
                    pods = r.json()["items"]
                    if len(pods) == 2 and all(p["status"].get("phase") == "Running" for p in pods):
                        break
                    await trio.sleep(0.1)
            nursery.cancel_scope.cancel()

A user's controller runs in the same nursery with `InProcessClient(h.api, ADMIN)` (no HTTP) or
with an HTTP client built from `h.kubeconfig`, as in production.
"""
