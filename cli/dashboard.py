"""``tuner dashboard``: a live, read-only web view of the studies in a database (or behind a
running server).

The page (``cli/dashboard.html`` and ``cli/dashboard.js``, no build step) lists the studies
and, for the one chosen, shows: the state of the session (trials by status, running or
finished), the default and the best with their metrics, the confirmation's ratio with its
interval, the convergence, the parameter importance from the study's GP, parallel
coordinates of the knobs, the Pareto front of a study with several objectives, and a
sortable trial table (feasibility, step kind, the knobs each trial changes). It polls the
JSON endpoints every two seconds and redraws only what changed, so it follows a session
while it runs.

Why a page of our own with Plotly, and not optuna-dashboard's UI over our storage: its UI
reads Optuna's storage and its model (distributions, intermediate values, user attrs), so
serving it means translating our trials, step kinds, repeats, controls and confirmations into
a model that has none of them, and every one would be lost or faked; and it is a React build
we would have to ship or pin. Plotly.js is the library optuna-dashboard itself draws with, it
has parallel coordinates, and its bundle comes with the ``plotly`` wheel, so the dashboard
serves it from the installed package and needs no network and nothing vendored here.

Endpoints (GET and HEAD only; everything else is refused with 405):

- ``/``, ``/dashboard.js``, ``/plotly.min.js``: the page.
- ``/api/studies``: every study, with its objectives, knob count, trials by status, best.
- ``/api/study?name=S``: one study (see ``study_view``).
- ``/api/importance?name=S[&metric=M]``: the Sobol indices of ``tuner importance``, computed
  once per set of completed trials (needs the full install).
- ``/healthz``: ``ok``.

JSON answers carry an ETag and ``Cache-Control: no-cache``, so a poll that finds nothing new
costs a 304. Access follows the server's rules: loopback by default (and then only requests
whose ``Host`` names loopback, against DNS rebinding); any other address needs TLS
(``--tls-cert``, ``--tls-key``) and a token (``--access-token-file``), which a browser sends
once as ``/?token=...`` (the answer moves it into a cookie and drops it from the address) and
a program as ``Authorization: Bearer ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import math
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cli.common import connect, out
from cli.render import (
    changes,
    confirmation_headline,
    confirmed,
    default_config,
    default_trial,
    learned_from,
)
from cli.verdict import headline, reported_best
from server.security import ServerSecurity, check_exposure, is_loopback
from tuner.confirmation import Best, Confirmation, improvement
from tuner.errors import NotFoundError, StateError, TunerError, ValidationError
from tuner.extras import install_hint
from tuner.study import StudySpec
from tuner.trial import (
    MeasurementKind,
    Trial,
    TrialStatus,
    best_so_far,
    is_feasible,
    pareto_front,
    with_resolved_constraints,
)

#: How often the page asks for news (milliseconds; it is in the page's JSON config).
POLL_MS = 2000

COOKIE = "tuner_dashboard"

ENDPOINTS = "/, /api/studies, /api/study?name=S, /api/importance?name=S[&metric=M], /healthz"

PAGES = {
    "/": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
}


# -- what the page shows --------------------------------------------------------------------
def studies_view(api: Any) -> list[dict[str, Any]]:
    """Every study: name, objectives, constraints, knob count, trials by status, best id."""
    return [
        {
            "name": info.spec.name,
            "objectives": [{"name": o.name, "goal": o.goal.value} for o in info.spec.objectives],
            "constraints": [str(c) for c in info.spec.outcome_constraints],
            "knobs": len(info.spec.space),
            "trials": sum(info.trial_counts.values()),
            "counts": {str(k): v for k, v in info.trial_counts.items() if v},
            "best_trial": info.best_trial_id,
        }
        for info in api.list_studies()
    ]


def study_view(api: Any, name: str) -> dict[str, Any]:
    """One study as the page draws it.

    Keys: ``name``, ``objectives``, ``metrics``, ``constraints``, ``knobs`` (each knob's
    ``to_dict``), ``counts`` (trials by status), ``running`` (trials handed out or queued),
    ``updated`` (the latest change, epoch seconds), ``default`` (its trial id, or None),
    ``best`` (the study's best trial's id, one objective: the one ``tuner best`` names,
    ``cli.verdict``), ``verdict`` (its headline, ``tone`` and ``basis``), ``front`` (ids
    on the Pareto front), ``trials`` (id order; each with ``status``, ``step``, ``feasible``
    (true/false/null), ``repeats``, ``metrics``, ``spread``, ``windows`` (progress windows
    reported: an EARLY_STOPPED trial's fidelity), ``transfer`` (what each transfer source
    weighed in its suggestion, the study's own model as ``""``), ``config``, ``changed`` (the
    knobs that differ from the default), ``reason``, ``best_so_far``), ``controls`` (the
    default re-measured between trials: ``after`` (the last trial finished before it),
    ``metrics``), ``confirmation`` (None, or the verdict, the ratio's interval and the best
    in metric units), ``ratio`` (best / default, oriented so that more than 1 is better) and
    ``learned_from`` (``cli.render.learned_from``: the latest weights of the transfer sources,
    or None).
    """
    spec = api.get_study(name).spec
    trials = sorted(api.list_trials(name), key=lambda t: t.id)
    measurements = api.list_measurements(name)
    resolved = with_resolved_constraints(spec, trials)
    reference = default_config(spec, trials)
    default = default_trial(trials, reference)
    found = None if spec.multi_objective else reported_best(api, name, spec, trials, measurements)
    best = None if found is None else found.trial
    front = pareto_front(spec, trials) if spec.multi_objective else []
    so_far = best_so_far(spec, trials)
    finished = [t.updated_at for t in trials if t.updated_at]
    controls = [m for m in measurements if m.kind is MeasurementKind.CONTROL]
    view = {
        "name": spec.name,
        "objectives": [{"name": o.name, "goal": o.goal.value} for o in spec.objectives],
        "metrics": list(spec.metric_names),
        "constraints": [c.text(digits=6) for c in resolved.outcome_constraints],
        "knobs": [_knob(knob) for knob in spec.space.knobs],
        "counts": _counts(trials),
        "running": sum(t.status in (TrialStatus.ACTIVE, TrialStatus.PENDING) for t in trials),
        "updated": max([*finished, *(m.at for m in measurements)], default=None),
        "default": default.id if default else None,
        "best": best.id if best else None,
        "front": [t.id for t in front],
        "ratio": improvement(resolved, default, best),
        "verdict": _verdict(spec, found, trials),
        "trials": [_trial(resolved, t, reference, b) for t, b in zip(trials, so_far, strict=True)],
        "controls": [{"after": _after(trials, m.at), "metrics": m.metrics} for m in controls],
        "confirmation": _confirmation(spec, None if found is None else found.confirmation),
        "learned_from": learned_from(trials) or None,
    }
    return view


def importance_view(
    api: Any, name: str, metric: str | None, trials: Sequence[Trial] | None = None
) -> dict[str, Any]:
    """``tuner importance``'s indices of ``metric`` (default: the first objective), from
    ``trials`` (default: the study's, read now).

    Raises:
        ValidationError: No such metric (field ``metric``).
        StateError: Too few completed trials (the page shows the message).
    """
    spec = api.get_study(name).spec
    trials = api.list_trials(name) if trials is None else trials
    from tuner.designer.models.importance import importance  # torch: only here

    found = importance(spec, trials, metric, samples=512)
    return {
        "metric": metric or spec.objective.name,
        "completed": sum(t.status is TrialStatus.COMPLETED for t in trials),
        "knobs": [
            {"knob": k.knob, "total": k.total, "total_se": k.total_se, "first": k.first,
             "first_se": k.first_se}
            for k in found
        ],
    }  # fmt: skip


def _after(trials: Sequence[Trial], at: float) -> int:
    """The last trial finished before ``at`` (0: none), where a control is drawn."""
    return max((t.id for t in trials if t.updated_at and t.updated_at <= at), default=0)


def _knob(knob: Any) -> dict[str, Any]:
    """A knob's ``to_dict``, with the values of a choice knob (a bool's too) listed."""
    found = knob.to_dict()
    if hasattr(knob, "choices"):
        found["choices"] = list(knob.choices)
    return found


def _trial(
    spec: StudySpec, trial: Trial, reference: Mapping[str, Any], so_far: float | None
) -> dict[str, Any]:
    return {
        "id": trial.id,
        "status": trial.status.value,
        "step": trial.step.value,
        "feasible": is_feasible(spec, trial) if trial.status is TrialStatus.COMPLETED else None,
        "repeats": trial.repeats if trial.status.is_final else None,
        "metrics": trial.metrics,
        "spread": trial.spread if trial.repeats > 1 else {},
        "windows": trial.windows,
        "transfer": dict(trial.transfer),
        "config": trial.config,
        "changed": changes(trial.config, reference, spec.space),
        "unused": sorted(spec.space.inactive(trial.config)),
        "reason": trial.reason,
        "best_so_far": so_far,
        "updated": trial.updated_at or None,
    }


def _counts(trials: Sequence[Trial]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.status.value] = counts.get(t.status.value, 0) + 1
    return counts


def _verdict(spec: StudySpec, found: Best | None, trials: Sequence[Trial]) -> Any:
    """The headline ``tuner best`` and the session print, and how the best was chosen."""
    if found is None:
        return None
    text, tone = headline(spec, found, trials)
    return {"text": text, "tone": tone, "basis": found.basis.value,
            "confirmed": not found.unconfirmed}  # fmt: skip


def _confirmation(spec: StudySpec, found: Confirmation | None) -> Any:
    if found is None:
        return None
    in_units = confirmed(spec, found)
    return {
        **confirmation_headline(found),
        "default_feasible": found.default_feasible,
        "value": None if in_units is None else dict(zip(("mean", "low", "high"), in_units,
                                                        strict=True)),
    }  # fmt: skip


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


# -- the HTTP server ------------------------------------------------------------------------
@dataclass
class Dashboard:
    """What the request handlers share: the API the data comes from, the access rules, and
    the importance cache (one GP fit per study, metric and set of finished trials)."""

    api: Any
    source: str
    token: str | None = None
    loopback_only: bool = True
    tls: bool = False
    _cache: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _computing: dict[tuple[Any, ...], threading.Lock] = field(default_factory=dict)

    def importance(self, name: str, metric: str | None) -> dict[str, Any]:
        trials = self.api.list_trials(name)
        key = (name, metric, tuple((t.id, t.status.value, t.repeats) for t in trials
                                   if t.status.is_final))  # fmt: skip
        with self._lock:
            gate = self._computing.setdefault(key[:2], threading.Lock())
        with gate:  # one fit at a time per study and metric; the others wait for it
            found = self._cache.get(key)
            if found is None:
                found = importance_view(self.api, name, metric, trials)
                self._cache = {k: v for k, v in self._cache.items() if k[:2] != key[:2]}
                self._cache[key] = found
        return found


class Handler(BaseHTTPRequestHandler):
    server_version = "tuner-dashboard"
    dashboard: Dashboard  # set on the subclass ``serve`` makes

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request per poll would flood the terminal

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _refuse_method(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b"read-only: GET and HEAD only\n",
                   "text/plain; charset=utf-8", extra={"Allow": "GET, HEAD"})  # fmt: skip

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def _answer(self, head: bool) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if not self._allowed(url.path, query):
            return
        try:
            if url.path in PAGES:
                file, kind = PAGES[url.path]
                body = resources.files("cli").joinpath(file).read_bytes()
                self._send(HTTPStatus.OK, body, kind, head=head)
            elif url.path == "/plotly.min.js":
                self._send(HTTPStatus.OK, plotly_js(), "text/javascript; charset=utf-8",
                           head=head, extra={"Cache-Control": "max-age=86400"})  # fmt: skip
            elif url.path == "/healthz":
                self._send(HTTPStatus.OK, b"ok\n", "text/plain; charset=utf-8", head=head)
            elif url.path == "/api/studies":
                self._json({"source": self.dashboard.source, "poll_ms": POLL_MS,
                            "studies": studies_view(self.dashboard.api)}, head)  # fmt: skip
            elif url.path == "/api/study":
                self._json(study_view(self.dashboard.api, _required(query, "name")), head)
            elif url.path == "/api/importance":
                name = _required(query, "name")
                self._json(self.dashboard.importance(name, query.get("metric") or None), head)
            else:
                self._error(HTTPStatus.NOT_FOUND, "path", f"no page {url.path!r}", ENDPOINTS)
        except ValidationError as exc:
            self._error(HTTPStatus.BAD_REQUEST, exc.field, exc.message, exc.allowed)
        except NotFoundError as exc:
            self._error(HTTPStatus.NOT_FOUND, "name", str(exc))
        except StateError as exc:
            self._error(HTTPStatus.CONFLICT, "", str(exc))
        except ModuleNotFoundError as exc:
            hint = install_hint(exc.name or "") or f"{exc.name}, which is not installed"
            self._error(HTTPStatus.NOT_IMPLEMENTED, "", f"this needs {hint}")
        except TunerError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "", f"{type(exc).__name__}: {exc}")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the browser left

    # access ------------------------------------------------------------------------------
    def _allowed(self, path: str, query: Mapping[str, str]) -> bool:
        board = self.dashboard
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0] if self.headers else ""
        if board.loopback_only and board.token is None and not is_loopback(host, resolve=False):
            self._error(HTTPStatus.FORBIDDEN, "Host",
                        f"this dashboard answers only requests addressed to loopback, not "
                        f"{host!r}", "localhost, 127.0.0.1, [::1]")  # fmt: skip
            return False
        if board.token is None or path == "/healthz":
            return True
        expected = board.token.encode()
        sent = query.get("token")
        if sent is not None and hmac.compare_digest(sent.encode(), expected):
            cookie = f"{COOKIE}={board.token}; Path=/; HttpOnly; SameSite=Strict"
            if board.tls:
                cookie += "; Secure"
            self._send(HTTPStatus.SEE_OTHER, b"", "text/plain",
                       extra={"Location": path, "Set-Cookie": cookie})  # fmt: skip
            return False
        bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ").encode()
        jar = SimpleCookie(self.headers.get("Cookie") or "")
        held = jar[COOKIE].value.encode() if COOKIE in jar else b""
        if hmac.compare_digest(bearer, expected) or hmac.compare_digest(held, expected):
            return True
        self._error(HTTPStatus.UNAUTHORIZED, "token",
                    "missing or wrong token: open /?token=TOKEN once (the token of "
                    "--access-token-file), or send 'Authorization: Bearer TOKEN'")  # fmt: skip
        return False

    # answers -----------------------------------------------------------------------------
    def _json(self, document: Any, head: bool) -> None:
        body = json.dumps(finite(document), allow_nan=False).encode()
        tag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
        if tag in (self.headers.get("If-None-Match") or ""):
            self._send(HTTPStatus.NOT_MODIFIED, b"", "application/json", head=True,
                       extra={"ETag": tag, "Cache-Control": "no-cache"})  # fmt: skip
            return
        self._send(HTTPStatus.OK, body, "application/json", head=head,
                   extra={"ETag": tag, "Cache-Control": "no-cache"})  # fmt: skip

    def _error(self, status: HTTPStatus, field_: str, message: str, allowed: Any = None) -> None:
        document: dict[str, Any] = {"error": message, "field": field_, "status": status.value}
        if allowed:
            document["allowed"] = allowed if isinstance(allowed, str) else list(allowed)
        self._send(status, json.dumps(document).encode(), "application/json",
                   extra={"Cache-Control": "no-store"})  # fmt: skip

    def _send(
        self, status: HTTPStatus, body: bytes, kind: str, head: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> None:  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        # Plotly's parallel coordinates compile WebGL shaders with new Function()
        self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'self' "
                         "'unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                         "frame-ancestors 'none'")  # fmt: skip
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)


def _required(query: Mapping[str, str], key: str) -> str:
    value = query.get(key)
    if not value:
        raise ValidationError(key, "missing", f"?{key}=STUDY")
    return value


_PLOTLY: list[bytes] = []


def plotly_js() -> bytes:
    """Plotly's bundle, from the installed ``plotly`` package (read once).

    Raises:
        ModuleNotFoundError: ``plotly`` is not installed.
    """
    if not _PLOTLY:
        import plotly

        _PLOTLY.append((Path(plotly.__file__).parent / "package_data" / "plotly.min.js")
                       .read_bytes())  # fmt: skip
    return _PLOTLY[0]


def serve(
    api: Any,
    source: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    tls: tuple[Path, Path] | None = None,
) -> ThreadingHTTPServer:
    """A started dashboard (in a daemon thread); ``shutdown()`` stops it.

    Raises:
        ValidationError: ``host`` is not loopback and TLS or the token is missing.
    """  # fmt: skip
    check_exposure(host, tls is not None, token is not None, "--access-token-file")
    plotly_js()  # a missing plotly fails here, not in the browser
    board = Dashboard(api, source, token=token, loopback_only=is_loopback(host),
                      tls=tls is not None)  # fmt: skip
    handler = type("BoundHandler", (Handler,), {"dashboard": board})
    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((host, port), handler)
    httpd.daemon_threads = True
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(tls[0]), str(tls[1]))
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, name="dashboard", daemon=True).start()
    return httpd


def cmd_dashboard(args: argparse.Namespace) -> int:
    security = ServerSecurity.from_files(
        args.tls_cert, args.tls_key, args.access_token_file, token_option="--access-token-file"
    )
    tls = (args.tls_cert, args.tls_key) if security.tls else None
    source = args.server or str(args.db)
    with connect(args.server, args.db) as api:
        httpd = serve(api, source, args.host, args.port, security.token, tls)
        scheme = "https" if tls else "http"
        host, port = str(httpd.server_address[0]), int(httpd.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        out.print(f"dashboard of {source} at {scheme}://{shown}:{port}/ (read-only; Ctrl-C "
                  "stops it)", highlight=False, soft_wrap=True)  # fmt: skip
        if args.port_file:
            args.port_file.write_text(f"{port}\n", encoding="utf-8")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            out.print("dashboard stopped")
        finally:
            httpd.shutdown()
            httpd.server_close()
    return 0
