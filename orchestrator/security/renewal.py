"""Leaf certificates kept valid while the process runs: renewed before they expire, pairs
replaced on disk picked up, and both hot-swapped into the live listeners and clients.

Theory of operation
-------------------
A `Leaf` is one certificate/key pair this process serves or dials with, and how to issue a new
one: the API server's serving certificate (`apiserver`, re-issued from the local CA), the API
server's client certificate for node agents (`apiserver-kubelet-client`), the embedded agent's
log endpoint certificate (`kubelet` in the server's renewer, issued from the local CA), a joined
agent's (`kubelet`, requested from the API server with the node's credentials, the path it
takes at start).
Consumers register a `reload` coroutine per leaf (`on_reload`) that rebuilds their SSL context
from the files (`tls.ReloadableContext.reload` for a listener: new connections get the new
certificate, open ones keep theirs).

`CertRenewer.run` wakes every `watch_interval` seconds (default 5), observes each leaf (reads
the pair under its `pki.pair_lock`, in a worker thread) and lets the pure `decide` choose:

* RENEW — on a check (at start, then every `check_interval`, default 12 h; `retry_interval`
  after a failed renewal) when the pair is missing, is not a matching pair, or expires within
  the leaf's `renew_before`: issue a new pair (bounded by `issue_timeout`), then RELOAD;
* RELOAD — the pair on disk is not the one the consumers were last built from (renewed here,
  rotated by `orchestrator certs rotate` from another process, or a consumer registered since):
  every consumer reloads; the pair counts as loaded only when all of them succeeded, so a failed
  reload is retried on the next tick;
* KEEP.

So a rotation reaches a running process within `watch_interval`, with no signal and no pid
file. Time: the intervals are trio's clock (`trio.testing.MockClock` in tests); expiry is judged
by the injectable wall clock `RenewalConfig.now`. The decision looks only at expiry and at the
pair itself: SANs and issuer are checked when the process starts (`pki.ensure_pki`,
`agent.servingcert.ensure_serving_cert`), and they do not change while it runs.

Invariants: a failed renewal leaves the old pair in place (served while still valid), is logged
and retried after `retry_interval`, and never stops the process; a consumer keeps its old
context until a new one was built; `certificate_expiration_timestamp_seconds{cert}` is the
expiry of the pair last observed on disk.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from orchestrator.security.pki import RENEW_BEFORE, Pki, pair_lock, renew_serving_cert

log = logging.getLogger(__name__)

Reload = Callable[[], Awaitable[None]]


class Action(enum.Enum):
    KEEP = "keep"
    RENEW = "renew"
    RELOAD = "reload"


@dataclass(frozen=True)
class Observation:
    """A pair as read from disk. `fingerprint` is the SHA-256 of certificate and key (PEM);
    None when the pair is missing, unreadable or not a pair (`problem` says which)."""

    fingerprint: str | None
    not_after: dt.datetime | None = None
    serial: int | None = None
    problem: str = ""


def decide(
    observed: Observation,
    loaded: str | None,
    now: dt.datetime,
    renew_before: dt.timedelta,
    *,
    check_due: bool,
) -> Action:
    """What to do with a leaf (module doc). `loaded`: the fingerprint the consumers were last
    built from (None: not yet); `check_due`: whether a renewal check is due now."""
    usable = observed.fingerprint is not None and observed.not_after is not None
    if check_due and (
        not usable or observed.not_after is None or observed.not_after - renew_before <= now
    ):
        return Action.RENEW
    if usable and observed.fingerprint != loaded:
        return Action.RELOAD
    return Action.KEEP


def read_pair(cert_path: Path, key_path: Path) -> Observation:
    """Observe a certificate/key pair (blocking I/O, under the pair's lock)."""
    with pair_lock(cert_path):
        try:
            cert_pem, key_pem = Path(cert_path).read_bytes(), Path(key_path).read_bytes()
        except OSError as exc:
            return Observation(None, problem=f"{exc.filename}: {exc.strerror}")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        return Observation(None, problem=f"{cert_path}: unreadable pair ({exc})")
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        return Observation(
            None,
            cert.not_valid_after_utc,
            cert.serial_number,
            f"{key_path} is not the key of {cert_path}",
        )
    fingerprint = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
    return Observation(fingerprint, cert.not_valid_after_utc, cert.serial_number)


@dataclass
class Leaf:
    """One certificate/key pair and how to issue a new one: `issue` writes a fresh pair (with
    `pki.write_pair` or under `pki.pair_lock`) or raises."""

    name: str
    cert_path: Path
    key_path: Path
    issue: Callable[[], Awaitable[object]]
    renew_before: dt.timedelta = RENEW_BEFORE

    async def observe(self) -> Observation:
        return await trio.to_thread.run_sync(read_pair, self.cert_path, self.key_path)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class RenewalConfig:
    """Seconds, on trio's clock; `now` is the wall clock expiry is judged by (tests move it)."""

    check_interval: float = 12 * 3600.0  # how often expiry is checked
    watch_interval: float = 5.0  # how often the files are compared with what is loaded
    retry_interval: float = 300.0  # after a failed renewal
    issue_timeout: float = 60.0  # bound on one renewal (a joined agent asks its server)
    now: Callable[[], dt.datetime] = _utcnow


@dataclass
class _State:
    leaf: Leaf
    reloads: list[Reload] = field(default_factory=list)
    loaded: str | None = None  # fingerprint the consumers were last built from
    next_check: float = -math.inf  # trio time of the next renewal check
    observed: Observation | None = None
    renewals: int = 0
    failures: int = 0


class CertRenewer:
    """The renewal loop of one process (module doc). Add leaves and consumers at any time."""

    def __init__(self, config: RenewalConfig | None = None) -> None:
        self.config = config or RenewalConfig()
        self._leaves: dict[str, _State] = {}

    def add(self, leaf: Leaf) -> None:
        """Watch `leaf` (replacing a leaf of the same name, keeping its consumers)."""
        old = self._leaves.get(leaf.name)
        self._leaves[leaf.name] = _State(leaf, reloads=old.reloads if old else [])

    def on_reload(self, name: str, reload: Reload) -> None:
        """Call `reload` whenever leaf `name`'s pair changes on disk. Every consumer of the leaf
        reloads on the next tick (the newcomer may have read the files before the last change)."""
        state = self._leaves.get(name)
        if state is None:
            raise KeyError(f"no certificate {name!r} is watched")
        state.reloads.append(reload)
        state.loaded = None

    def statistics(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, st in self._leaves.items():
            obs = st.observed
            loaded = st.loaded is not None and obs is not None and obs.fingerprint == st.loaded
            out[name] = {
                "serial": obs.serial if obs else None,
                "not_after": obs.not_after if obs else None,
                "loaded": loaded,
                "renewals": st.renewals,
                "failures": st.failures,
            }
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            for state in list(self._leaves.values()):
                await self._step(state)
            await trio.sleep(self.config.watch_interval)

    async def _step(self, state: _State) -> None:
        leaf, cfg = state.leaf, self.config
        observed = await leaf.observe()
        check_due = trio.current_time() >= state.next_check
        action = decide(observed, state.loaded, cfg.now(), leaf.renew_before, check_due=check_due)
        if check_due:
            state.next_check = trio.current_time() + cfg.check_interval
        if action is Action.RENEW:
            observed = await self._renew(state, observed)
            action = decide(observed, state.loaded, cfg.now(), leaf.renew_before, check_due=False)
        state.observed = observed
        _export_expiry(leaf.name, observed)
        if action is Action.RELOAD:
            await self._reload(state, observed)

    async def _renew(self, state: _State, observed: Observation) -> Observation:
        leaf, cfg = state.leaf, self.config
        why = observed.problem or f"it expires {observed.not_after:%Y-%m-%d %H:%M:%SZ}"
        try:
            with trio.fail_after(cfg.issue_timeout):
                await leaf.issue()
        except Exception as exc:  # the old pair serves on while valid: say what broke, retry
            state.failures += 1
            state.next_check = trio.current_time() + cfg.retry_interval
            log.warning(
                "certificate %s: renewal failed (%s): %s; retrying in %.0f s",
                leaf.name,
                why,
                exc or type(exc).__name__,
                cfg.retry_interval,
            )
            return observed
        state.renewals += 1
        renewed = await leaf.observe()
        log.info(
            "certificate %s renewed (%s): serial %x, valid until %s",
            leaf.name,
            why,
            renewed.serial or 0,
            renewed.not_after,
        )
        return renewed

    async def _reload(self, state: _State, observed: Observation) -> None:
        failed = False
        for reload in list(state.reloads):
            try:
                await reload()
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                failed = True
                log.warning("certificate %s: reload failed: %s", state.leaf.name, exc)
        if failed:
            return
        level = logging.DEBUG if state.loaded is None else logging.INFO
        log.log(
            level,
            "certificate %s loaded: serial %x, valid until %s",
            state.leaf.name,
            observed.serial or 0,
            observed.not_after,
        )
        state.loaded = observed.fingerprint


def in_thread(fn: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    """An `issue` for a blocking issuer (pki functions): run it in a worker thread."""

    async def issue() -> object:
        return await trio.to_thread.run_sync(fn)

    return issue


SERVING = "apiserver"


def serving_leaf(pki: Pki, sans: list[str]) -> Leaf:
    """The API server's serving certificate, re-issued from the local CA with the SANs it was
    started with (`sans`: its extra ones, as given to `ensure_pki`)."""
    issue = in_thread(partial(renew_serving_cert, pki, sans))
    return Leaf(SERVING, pki.serving_cert_path, pki.serving_key_path, issue)


def _export_expiry(name: str, observed: Observation) -> None:
    from orchestrator.observability import CERT_EXPIRATION

    if observed.not_after is not None:
        CERT_EXPIRATION.labels(name).set(observed.not_after.timestamp())
