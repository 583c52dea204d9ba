"""The ``callgate`` command line: a stable, public interface (DESIGN "Command line").

Every reporting command takes ``--json`` and then prints exactly one JSON value on
stdout. Exit codes: 0 when the command did its job (a denied call is a successful
command whose outcome is a denial); 1 when the command itself failed (refused
approval, timeout, unreachable broker); 2 for misuse (unknown flag, unreadable
profile, malformed JSON arguments). Never a traceback.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain.catalog import ProfileError
from callgate.domain.codes import Rejection
from callgate.domain.limits import parse_args
from callgate.surfaces.render import Renderer

EXIT_OK, EXIT_FAILED, EXIT_MISUSE = 0, 1, 2


class Misuse(Exception):
    """The command was used wrongly; exit 2 with the message."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"callgate: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_MISUSE)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print exactly one JSON value",
    )
    common.add_argument("--state-dir", type=Path, default=argparse.SUPPRESS)
    common.add_argument("--backend", choices=["embedded", "kafka"], default=argparse.SUPPRESS)
    common.add_argument("--bootstrap-servers", default=argparse.SUPPRESS)
    common.add_argument("--profile", type=Path, default=argparse.SUPPRESS)

    p = _Parser(
        prog="callgate",
        description="Tool-call authorization gateway for AI agents.",
        parents=[common],
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("serve", parents=[common], help="run all deciders and projections")
    s.add_argument("--only", action="append", default=[], help="run only these processes (kafka)")

    sess = sub.add_parser("session", parents=[common], help="development session tokens")
    sess_sub = sess.add_subparsers(dest="session_command", required=True, parser_class=_Parser)
    issue = sess_sub.add_parser("issue", parents=[common], help="issue a signed session token")
    issue.add_argument("--user", required=True)
    issue.add_argument("--tenant", required=True)
    issue.add_argument("--roles", default="", help="comma-separated roles")
    issue.add_argument("--ttl", type=int, default=3600, help="seconds")

    sub.add_parser("catalog", parents=[common], help="the tools with their flags and schemas")

    pr = sub.add_parser("propose", parents=[common], help="propose a tool call and wait for it")
    pr.add_argument("--session", required=True)
    pr.add_argument("--tool", required=True)
    pr.add_argument("--args", required=True, help="JSON object")
    pr.add_argument("--idempotency-key")
    pr.add_argument("--approval-id")
    pr.add_argument("--timeout", type=float, default=30.0)

    pe = sub.add_parser("pending", parents=[common], help="pending approvals")
    pe.add_argument("--session", required=True, help="reads show only the session's tenant")

    ap = sub.add_parser("approve", parents=[common], help="approve a pending call")
    ap.add_argument("invocation_id")
    ap.add_argument("--session", required=True)
    ap.add_argument("--timeout", type=float, default=30.0)

    de = sub.add_parser("deny", parents=[common], help="deny a pending call")
    de.add_argument("invocation_id")
    de.add_argument("--session", required=True)
    de.add_argument("--reason", default="")
    de.add_argument("--timeout", type=float, default=30.0)

    st = sub.add_parser("status", parents=[common], help="status of one invocation")
    st.add_argument("invocation_id")
    st.add_argument("--session", required=True, help="reads show only the session's tenant")

    au = sub.add_parser("audit", parents=[common], help="the audit trail; `audit verify` checks it")
    au.add_argument("action", nargs="?", choices=["verify"])
    au.add_argument("--invocation")
    au.add_argument("--session", help="required to list records: only the session's tenant")

    sub.add_parser("replay", parents=[common], help="rebuild projections from the log and compare")
    sub.add_parser("effects", parents=[common], help="side effects of the simulated providers")

    dm = sub.add_parser("demo", parents=[common], help="walk through the contract end to end")
    dm.add_argument("--keep", action="store_true", help="keep the demo state dir")

    be = sub.add_parser("bench", parents=[common], help="benchmark figures")
    be.add_argument("--quick", action="store_true", help="tiny counts (smoke run)")
    be.add_argument("--only", action="append", default=[])

    ch = sub.add_parser(
        "chaos", parents=[common], help="chaos run on the Kafka backend (test broker)"
    )
    ch.add_argument("--proposals", type=int, default=2000)
    ch.add_argument("--kills", type=int, default=10)
    ch.add_argument("--seed", type=int, default=7)
    return p


def settings_from(ns: argparse.Namespace) -> Settings:
    return Settings.from_env(
        state_dir=getattr(ns, "state_dir", None),
        backend=getattr(ns, "backend", None),
        bootstrap_servers=getattr(ns, "bootstrap_servers", None),
        profile=getattr(ns, "profile", None),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    out = Renderer(json_mode=getattr(ns, "json", False))
    try:
        settings = settings_from(ns)
        if (
            settings.backend == "kafka"
            and not settings.bootstrap_servers
            and ns.command
            not in (
                "session",
                "catalog",
                "chaos",
                "bench",
                "demo",
            )
        ):
            raise Misuse(
                "--backend kafka needs --bootstrap-servers (or CALLGATE_BOOTSTRAP_SERVERS)"
            )
        app = bootstrap(settings)
        # Load the profile now: an unreadable one is misuse (exit 2) that must surface
        # before a command publishes anything, or the call would run later anyway.
        app.profile  # noqa: B018
        return _dispatch(ns, app, out)
    except Misuse as e:
        print(f"callgate: error: {e}", file=sys.stderr)
        return EXIT_MISUSE
    except ProfileError as e:
        print(f"callgate: error: {e}", file=sys.stderr)
        return EXIT_MISUSE
    except Rejection as e:
        out.error(e.code.value, e.message)
        return EXIT_FAILED
    except TimeoutError as e:
        out.error("timeout", str(e))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: a message, never a traceback
        out.error("internal_error", f"{type(e).__name__}: {e}")
        return EXIT_FAILED


def _dispatch(ns: argparse.Namespace, app: App, out: Renderer) -> int:
    cmd = ns.command
    if cmd == "session":
        roles = [r for r in ns.roles.split(",") if r]
        token = app.session_issuer.issue(ns.user, ns.tenant, roles, app.clock(), ttl_seconds=ns.ttl)
        out.value({"token": token}, human=lambda c: c.print(token))
        return EXIT_OK
    if cmd == "catalog":
        out.catalog(app.profile.catalog_view(), app.profile.digest)
        return EXIT_OK
    if cmd == "serve":
        return _serve(ns, app, out)
    if cmd == "demo":
        from callgate.ops.demo import run_demo

        return run_demo(app.settings, out, keep=ns.keep)
    if cmd == "bench":
        from callgate.ops.bench import run_bench

        return run_bench(app.settings, out, quick=ns.quick, only=ns.only)
    if cmd == "chaos":
        from callgate.ops.chaos import run_chaos

        return run_chaos(app.settings, out, proposals=ns.proposals, kills=ns.kills, seed=ns.seed)

    from callgate.surfaces.sdk import connect

    gate = connect(app.settings, app)
    try:
        if cmd == "propose":
            limits = app.profile.limits
            try:  # the limits of every entry, before any parser (domain/limits.py)
                parse_args(ns.args, limits.max_args_bytes, limits.max_depth)
            except Rejection as e:
                if e.details.get("limit") in ("syntax", "type"):
                    raise Misuse(f"--args must be a JSON object: {e.message}") from None
                raise
            answer = gate.propose(
                ns.session,
                ns.tool,
                ns.args,
                idempotency_key=ns.idempotency_key,
                approval_id=ns.approval_id,
                timeout_s=ns.timeout,
            )
            out.answer(answer)
            return EXIT_OK if answer.get("settled") else EXIT_FAILED
        if cmd == "pending":
            out.pending(gate.pending(ns.session))
            return EXIT_OK
        if cmd in ("approve", "deny"):
            if cmd == "approve":
                d = gate.approve(ns.invocation_id, ns.session, ns.timeout)
                result = {k: d[k] for k in ("approval_id", "invocation_id", "expires_at")}
            else:
                d = gate.deny(ns.invocation_id, ns.session, ns.reason, ns.timeout)
                result = {
                    "invocation_id": d["invocation_id"],
                    "denied": True,
                    "reason": d.get("reason", ""),
                }
            out.value(result, human=lambda c: c.print_json(data=result))
            return EXIT_OK
        if cmd == "status":
            status = gate.status(ns.invocation_id, ns.session)
            if status is None:
                out.error("not_found", f"no invocation {ns.invocation_id}")
                return EXIT_FAILED
            out.value(status, human=lambda c: c.print_json(data=status))
            return EXIT_OK
        if cmd == "audit":
            if ns.action == "verify":
                v = gate.verify_audit()
                result = {
                    "ok": v.ok,
                    "records": v.records,
                    "first_bad": v.first_bad,
                    "reason": v.reason,
                }
                out.value(
                    result,
                    human=lambda c: c.print(
                        ("[green]audit chain verified" if v.ok else "[red]audit chain BROKEN")
                        + f" ({v.records} records)"
                        + (f": {v.reason}" if v.reason else "")
                    ),
                )
                return EXIT_OK if v.ok else EXIT_FAILED
            if ns.session is None:
                raise Misuse("audit needs --session (records are shown for its tenant only)")
            out.audit(gate.audit(ns.invocation, session=ns.session))
            return EXIT_OK
        if cmd == "effects":
            out.effects(gate.effects())
            return EXIT_OK
        if cmd == "replay":
            from callgate.ops.replay import replay

            report = replay(gate, out)
            out.value(report, human=lambda c: c.print_json(data=report))
            return EXIT_OK if report["equal"] else EXIT_FAILED
    finally:
        gate.close()
    raise Misuse(f"unknown command {cmd}")


def _serve(ns: argparse.Namespace, app: App, out: Renderer) -> int:
    stop = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if app.settings.backend == "kafka":
        from callgate.adapters.kafka.serve import serve_kafka

        return serve_kafka(app, stop, only=ns.only, out=out)
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.runner import EmbeddedRunner
    from callgate.adapters.embedded.store import EmbeddedStore

    codec = AvroCodec.default()
    store = EmbeddedStore(app.settings.state_dir, codec)
    runner = EmbeddedRunner(store, app.processes(), codec, app.clock)
    if not runner.acquire(timeout=5.0):
        out.error("busy", f"another callgate serve holds {app.settings.state_dir / 'runner.lock'}")
        return EXIT_FAILED
    out.serving(app.settings.state_dir.resolve(), pid=os.getpid())
    try:
        runner.serve(stop)
    finally:
        runner.release()
        store.close()
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
