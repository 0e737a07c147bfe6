"""The Kubernetes-compatible API server: schemas, patching, selectors, security and the ASGI app.

Requests flow authn -> authz -> decode -> admission (defaults, schema validation, node
restriction) -> strategy (spec/status split, generation, metadata) -> store -> encode.
"""
