"""The privileged helper: the few writes that need root, done for an unprivileged tuner.

Clock and power setters need root (cpufreq and devfreq sysfs files, the Jetson's BPMP debugfs,
NVML's ``Set*``/``Reset*`` calls). Rather than run the tuner server or daemon as root, run this
small process as root and point the targets at its socket (``helper = "/run/tuner/helper.sock"``
in ``[target]`` of the ``cpufreq``, ``jetson`` and ``nvgpu`` targets)::

    sudo python -m targets.hardware.helper --socket /run/tuner/helper.sock --allow-uid 1000 \\
        --root /sys --root /sys/kernel/debug [--nvml pynvml]

It listens on a Unix socket and answers one JSON request per line with one JSON reply. It
does nothing but these, checked before anything is touched:

* ``{"op": "write", "path": P, "value": V}``: ``P`` must resolve (symlinks and ``..``
  followed) to a file under one of the ``--root`` directories whose name is one of
  ``WRITABLE`` (frequency limits and the EMC rate), and ``V`` a decimal integer;
* ``{"op": "nvml", "call": C, "device": I, "args": [...]}``: ``C`` one of ``NVML_CALLS``
  (lock and reset clocks, set the power limit) with its exact number of integer arguments,
  on GPU index ``I``;
* ``{"op": "ping"}``.

Only peers whose user id (``SO_PEERCRED``) is the helper's own or one of ``--allow-uid`` are
served; the socket file is world-connectable and that check is the gate. Each request is
logged on stderr as one JSON line. Replies are ``{"ok": true}`` or ``{"ok": false, "kind":
K, "error": text}`` with ``K`` one of ``refused`` (not allowed), ``permission``, ``rejected``
(NVML calls the value invalid: the configuration is at fault) and ``error``.
``HelperClient`` turns those into the target errors (``rejected`` -> ``ConfigRejected``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from tuner.errors import ConfigRejected, TargetError, ValidationError

#: sysfs/debugfs attribute names the helper writes: cpufreq and devfreq limits, EMC rate.
WRITABLE = frozenset(
    {"scaling_min_freq", "scaling_max_freq", "min_freq", "max_freq", "rate", "mrq_rate_locked"}
)
#: NVML setters and how many integer arguments follow the device.
NVML_CALLS = {
    "nvmlDeviceSetGpuLockedClocks": 2,
    "nvmlDeviceResetGpuLockedClocks": 0,
    "nvmlDeviceSetMemoryLockedClocks": 2,
    "nvmlDeviceResetMemoryLockedClocks": 0,
    "nvmlDeviceSetPowerManagementLimit": 1,
}
_VALUE = re.compile(r"[0-9]{1,15}")  # always fullmatch
_MAX_REQUEST = 4096
_TIMEOUT_S = 30.0


class HelperClient:
    """Talks to a running helper; one connection per request (a restarted helper is fine)."""

    def __init__(self, path: str | Path, timeout_s: float = _TIMEOUT_S) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s

    def write(self, path: Path, text: str, what: str) -> None:
        """Write ``text`` to the attribute ``path`` through the helper."""
        self._ask({"op": "write", "path": str(path), "value": text}, what)

    def nvml(self, call: str, device: int, *args: int) -> None:
        self._ask({"op": "nvml", "call": call, "device": device, "args": list(args)}, call)

    def ping(self) -> dict[str, Any]:
        return self._ask({"op": "ping"}, "ping")

    def _ask(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(self.timeout_s)
                conn.connect(self.path)
                conn.sendall(json.dumps(request).encode() + b"\n")
                reply = json.loads(_read_line(conn) or b"{}")
        except (OSError, ValueError) as exc:
            raise TargetError(
                f"cannot reach the privileged helper at {self.path}: {exc} (start it as root: "
                f"python -m targets.hardware.helper --socket {self.path} --allow-uid {os.getuid()})"
            ) from exc
        if reply.get("ok"):
            return dict(reply)
        kind, error = reply.get("kind", "error"), reply.get("error", "no reason given")
        if kind == "rejected":
            raise ConfigRejected(f"{what}: {error}")
        if kind == "permission":
            raise TargetError(f"{what}: {error} (the helper must run as root)")
        raise TargetError(f"privileged helper refused {what}: {error}")


def writer(helper: HelperClient | None, what: str) -> Callable[[Path, str], None]:
    """The write function a target passes around: through ``helper``, or direct."""
    from targets.hardware import sysfs

    if helper is None:
        return lambda path, text: sysfs.write(path, text, what)
    return lambda path, text: helper.write(path, text, what)


def option_helper(value: Any) -> HelperClient | None:
    """The ``helper`` option of a target: the socket path, or unset."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValidationError("target.helper", f"got {value!r}", "the helper's socket path")
    return HelperClient(value)


# -- the helper process -------------------------------------------------------------------
class Policy:
    """What the helper may do (module doc)."""

    def __init__(self, roots: list[Path], allowed_uids: set[int], nvml: ModuleType | None):
        self.roots = [r.resolve() for r in roots]
        self.allowed_uids = allowed_uids | {os.getuid()}
        self.nvml = nvml
        self._nvml_lock = threading.Lock()

    def handle(self, request: Any) -> dict[str, Any]:
        if not isinstance(request, dict):
            return _refused("a request is a JSON object")
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "uid": os.getuid()}
        if op == "write":
            return self._write(request.get("path"), request.get("value"))
        if op == "nvml":
            return self._nvml(request.get("call"), request.get("device"), request.get("args"))
        return _refused(f"unknown op {op!r}; allowed: ping, write, nvml")

    def _write(self, path: Any, value: Any) -> dict[str, Any]:
        if not isinstance(path, str) or not isinstance(value, str) or not _VALUE.fullmatch(value):
            return _refused("write needs a path and a decimal integer value")
        target = Path(path).resolve()
        if target.name not in WRITABLE:
            return _refused(f"{target.name!r} is not a writable attribute: {sorted(WRITABLE)}")
        if not any(target.is_relative_to(root) for root in self.roots):
            return _refused(f"{target} is outside the allowed roots {[str(r) for r in self.roots]}")
        try:
            with open(target, "w") as out:  # never creates: the attribute must exist
                out.write(value)
        except FileNotFoundError:
            return _refused(f"{target} does not exist")
        except PermissionError as exc:
            return {"ok": False, "kind": "permission", "error": str(exc)}
        except OSError as exc:
            return {"ok": False, "kind": "error", "error": f"{target}: {exc.strerror or exc}"}
        return {"ok": True}

    def _nvml(self, call: Any, device: Any, args: Any) -> dict[str, Any]:
        if self.nvml is None:
            return _refused("this helper was started without --nvml")
        if call not in NVML_CALLS:
            return _refused(f"{call!r} is not an allowed NVML call: {sorted(NVML_CALLS)}")
        if not (isinstance(device, int) and not isinstance(device, bool) and 0 <= device < 64):
            return _refused("device must be a GPU index in [0, 63]")
        if (
            not isinstance(args, list)
            or len(args) != NVML_CALLS[call]
            or not all(isinstance(a, int) and not isinstance(a, bool) for a in args)
            or not all(0 <= a <= 10_000_000 for a in args)
        ):
            return _refused(f"{call} takes {NVML_CALLS[call]} integers in [0, 10000000]")
        nvml = self.nvml
        with self._nvml_lock:
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(device)
                getattr(nvml, call)(handle, *args)
            except nvml.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == getattr(nvml, "NVML_ERROR_NO_PERMISSION", 4):
                    return {"ok": False, "kind": "permission", "error": str(exc)}
                if code == getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2):
                    return {"ok": False, "kind": "rejected", "error": str(exc)}
                return {"ok": False, "kind": "error", "error": str(exc)}
        return {"ok": True}


class _Handler(socketserver.StreamRequestHandler):
    server: HelperServer

    def handle(self) -> None:
        uid = _peer_uid(self.request)
        while True:
            line = self.rfile.readline(_MAX_REQUEST + 1)
            if not line:
                return
            if uid not in self.server.policy.allowed_uids:
                reply = _refused(f"uid {uid} is not allowed to use this helper")
                request: Any = None
            elif len(line) > _MAX_REQUEST:
                reply, request = _refused("request too long"), None
            else:
                try:
                    request = json.loads(line)
                    reply = self.server.policy.handle(request)
                except ValueError:
                    request, reply = None, _refused("not a JSON line")
            self.server.log(uid, request, reply)
            self.wfile.write(json.dumps(reply).encode() + b"\n")


class HelperServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, policy: Policy) -> None:
        self.policy = policy
        # The socket appears at its path only once it listens: bound and listening under a
        # temporary name, then renamed into place, so a client that waits for the path is
        # never refused (bind creates the file before listen is called).
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        staging.unlink(missing_ok=True)
        super().__init__(str(staging), _Handler)
        os.chmod(staging, 0o666)  # anyone may connect; SO_PEERCRED decides who is served
        os.replace(staging, path)
        self.server_address = str(path)

    def log(self, uid: int, request: Any, reply: dict[str, Any]) -> None:
        record = {"ts": time.time(), "uid": uid, "request": request, "reply": reply}
        print(json.dumps(record, default=str), file=sys.stderr, flush=True)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


def _refused(text: str) -> dict[str, Any]:
    return {"ok": False, "kind": "refused", "error": text}


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m targets.hardware.helper", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True)
    parser.add_argument("--allow-uid", type=int, action="append", default=[])
    parser.add_argument("--root", type=Path, action="append", default=[], help="writable tree")
    parser.add_argument("--nvml", help="NVML module for the GPU setters (pynvml)")
    args = parser.parse_args(argv)
    nvml = None
    if args.nvml:
        nvml = importlib.import_module(args.nvml)
        nvml.nvmlInit()
    server = HelperServer(args.socket, Policy(args.root, set(args.allow_uid), nvml))
    signal.signal(signal.SIGTERM, _interrupt)
    print(json.dumps({"event": "listening", "socket": str(args.socket)}), file=sys.stderr,
          flush=True)  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        args.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
