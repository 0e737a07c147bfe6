"""Security of the API server: PKI, tokens, authentication, authorization, kubeconfigs, TLS serving.

Layers, in request order: `tls.serve` terminates TLS and hands the verified client certificate
to the app (`client_cert_der(scope)`); `Authenticator` turns a bearer token or that certificate
into a `User` (always in `system:authenticated`); `authorize` checks the role table in `authz`;
`admit_node` (NodeRestriction) checks a node's writes against the object itself.

On disk (`DATA_DIR`): `pki/` (CA, serving cert; `ensure_pki`), `tokens.yaml` (hashes only;
`TokenStore`), and kubeconfigs written by `write_kubeconfig`. All files are written atomically,
secrets with mode 0600.
"""

from orchestrator.security.authn import (
    ANONYMOUS_PATHS,
    AUTHENTICATED,
    Authenticator,
    User,
    bearer_token,
)
from orchestrator.security.authz import (
    Attributes,
    admit_node,
    authorize,
    may_write_status,
    node_may_read,
    node_name,
)
from orchestrator.security.kubeconfig import ClientConfig, load_kubeconfig, write_kubeconfig
from orchestrator.security.pki import Pki, ensure_pki, issue_client_cert
from orchestrator.security.tls import client_cert_der, serve, server_ssl_context
from orchestrator.security.tokens import TokenEntry, TokenStore

__all__ = [
    "ANONYMOUS_PATHS",
    "AUTHENTICATED",
    "Attributes",
    "Authenticator",
    "ClientConfig",
    "Pki",
    "TokenEntry",
    "TokenStore",
    "User",
    "admit_node",
    "authorize",
    "bearer_token",
    "client_cert_der",
    "ensure_pki",
    "issue_client_cert",
    "load_kubeconfig",
    "may_write_status",
    "node_may_read",
    "node_name",
    "serve",
    "server_ssl_context",
    "write_kubeconfig",
]
