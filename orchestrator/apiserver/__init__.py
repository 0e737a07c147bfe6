"""The Kubernetes-compatible API server: the HTTP edge, the verbs, storage, watch, discovery.

Requests flow authn -> authz -> decode -> admission (defaults, schema validation, node
restriction) -> strategy (spec/status split, generation, metadata) -> store -> encode. The
object knowledge it applies lives in `orchestrator.kube`; who may do what in
`orchestrator.security`.
"""
