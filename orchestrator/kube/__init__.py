"""The Kubernetes object library: pure code about Kubernetes objects, with no I/O and no server.

`schema/` holds one schema per kind (validation, defaults, OpenAPI, table columns, merge keys:
the single source of truth), `patch/` the patch engines (JSON patch, merge patch, strategic
merge patch, server-side apply), `selectors` label and field selectors, `errors` the
`metav1.Status` errors, `protobuf` the protobuf body codec, `objects` the `Obj` type and object
helpers. Invariant: nothing here imports the API server, the store, or any I/O package.
"""
