"""How the command line shows things: one JSON value with ``--json``, rich tables otherwise.

Human output is for people: times as ISO-8601 UTC (JSON keeps epoch milliseconds, the
stable interface), tables that fit the terminal without cutting a tool name, and values
that are meant for the shell (a session token) printed bare, never wrapped. Into a pipe
or a file nothing is wrapped (a table is as wide as its widest row) and nothing moves:
progress (a spinner, the lines of a wait) is shown on a terminal only.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from callgate.domain.codes import Code
from callgate.logs import LogFormat, iso_utc, serve_line
from callgate.surfaces.report import report_error

T = TypeVar("T")

_OUTCOME_STYLE = {
    "executed": "green",
    "replayed": "cyan",
    "allowed": "green",
    "approval_required": "yellow",
    "outcome_uncertain": "magenta",
}


def outcome_style(code: str) -> str:
    return _OUTCOME_STYLE.get(code, "red")


def humane(value: Any) -> Any:
    """A copy for people: every ``*_at`` epoch-milliseconds field as ISO-8601 UTC."""
    if isinstance(value, dict):
        return {
            k: iso_ms(v)
            if k.endswith("_at") and isinstance(v, int) and not isinstance(v, bool)
            else humane(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [humane(v) for v in value]
    return value


# The width of output that is not a terminal: wide enough that rich never wraps a line.
PLAIN_WIDTH = 10_000


def console(stderr: bool = False) -> Console:
    """A rich console for stdout (or stderr): on a terminal as wide as the terminal; into
    a pipe or a file ``COLUMNS`` wide when that is set, else ``PLAIN_WIDTH``, so no cell or
    line is folded at rich's default of 80 columns."""
    found = Console(stderr=stderr, highlight=False)
    if found.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return found
    return Console(stderr=stderr, highlight=False, width=PLAIN_WIDTH)


def iso_ms(epoch_ms: int | float) -> str:
    """Epoch milliseconds (the JSON form of every time) as ISO-8601 UTC, for people."""
    return iso_utc(epoch_ms / 1000)


class Renderer:
    def __init__(self, json_mode: bool, log_format: LogFormat = "text") -> None:
        self.json_mode = json_mode
        self.log_format = log_format
        self.console = console()
        self.err = console(stderr=True)

    @property
    def shows_progress(self) -> bool:
        """Progress (spinners, lines per change) only for a person at a terminal."""
        return not self.json_mode and self.err.is_terminal

    def value(self, value: Any, human: Callable[[Console], None]) -> None:
        if self.json_mode:
            sys.stdout.write(json.dumps(value, sort_keys=True) + "\n")
        else:
            human(self.console)

    def plain(self, text: str) -> None:
        """``text`` alone on stdout, unwrapped, for ``$(...)`` in a shell."""
        sys.stdout.write(text + "\n")

    def record(self, value: dict[str, Any]) -> None:
        """A JSON object as one value (``--json``), else indented with ISO-8601 times."""
        self.value(value, human=lambda c: c.print_json(data=humane(value)))

    def error(self, code: Code, message: str) -> None:
        report_error(code, message, self.json_mode)

    def approval(self, value: dict[str, Any]) -> None:
        def human(c: Console) -> None:
            if "approval_id" not in value:  # a grant towards a quorum (ADR 0030)
                c.print(
                    f"[green]grant recorded[/] ({value['granted']} of {value['required']})\n"
                    f"  invocation {value['invocation_id']}",
                    soft_wrap=True,
                )
                return
            c.print(
                f"[green]approved[/]\n  invocation {value['invocation_id']}\n"
                f"  approval_id: {value['approval_id']}\n"
                f"  expires_at:  {iso_ms(value['expires_at'])}",
                soft_wrap=True,
            )
            if "outcome" in value:
                c.print(f"  the call: [{outcome_style(value['outcome'])}]{value['outcome']}[/]")

        self.value(value, human)

    def progress(
        self, invocation_id: str, seconds: float
    ) -> Callable[[dict[str, Any]], None] | None:
        """A line on stderr per change of an awaited invocation, only on a terminal."""
        if not self.shows_progress:
            return None
        self.err.print(f"waiting up to {seconds:g}s for invocation {invocation_id}")
        seen: list[str] = []

        def show(status: dict[str, Any]) -> None:
            approval = status.get("approval") or {}
            what = str(status.get("outcome"))
            if what == "approval_required" and approval.get("state"):
                what = f"approval {approval['state']}"
                if approval.get("state") == "pending" and approval.get("expires_at"):
                    what += f" (until {iso_ms(approval['expires_at'])})"
            if not seen or seen[-1] != what:
                seen.append(what)
                self.err.print(f"  {what}")

        return show

    def denial(self, value: dict[str, Any]) -> None:
        reason = f": {escape(value['reason'])}" if value.get("reason") else ""
        self.value(
            value,
            human=lambda c: c.print(
                f"[red]denied[/]{reason}\n  invocation {value['invocation_id']}"
            ),
        )

    def status(self, value: dict[str, Any]) -> None:
        self.record(value)

    def verification(self, value: dict[str, Any]) -> None:
        reason = f": {escape(str(value['reason']))}" if value.get("reason") else ""
        self.value(
            value,
            human=lambda c: c.print(
                ("[green]audit chain verified" if value["ok"] else "[red]audit chain BROKEN")
                + f"[/] ({value['records']} records){reason}"
            ),
        )

    def counting(self, items: Iterator[T], shards: int = 1) -> Iterator[T]:
        """``items`` unchanged, with a spinner and their count on a terminal's stderr (a
        replay's events; ``shards``: only the first shard's are seen); into a pipe, nothing."""
        if not self.shows_progress:
            yield from items
            return
        from rich.progress import Progress, SpinnerColumn, TextColumn

        label = "replaying {task.completed} events" + (
            f" (shard 1 of {shards} shown)" if shards > 1 else ""
        )
        with Progress(SpinnerColumn(), TextColumn(label), console=self.err) as bar:
            task = bar.add_task("replay", total=None)
            for n, item in enumerate(items, 1):
                if n % 1000 == 0:
                    bar.update(task, completed=n)
                yield item

    def replay(self, report: dict[str, Any]) -> None:
        """``views rebuilt from N events equal the live views``, or which differ and where."""

        def human(c: Console) -> None:
            views: dict[str, dict[str, Any]] = report["views"]
            if report["equal"]:
                c.print(
                    f"[green]views rebuilt from {report['events']} events equal the live views[/]"
                )
            else:
                c.print(f"[red]views rebuilt from {report['events']} events DIFFER[/]")
            for name, v in views.items():
                state = "equal" if v["equal"] else "[red]differ[/], first keys:"
                c.print(f"  {name}: {v['records']} records, {state}")
                for key in v["differing"]:
                    c.print(f"    {escape(str(key))}", soft_wrap=True)
            c.print(f"  rebuilt in {report['seconds']:g} s")

        self.value(report, human)

    def answer(self, answer: dict[str, Any]) -> None:
        def human(c: Console) -> None:
            code = answer["outcome"]
            # Invocation ids are long (bound to the session): on a line of their own.
            inv = answer.get("invocation_id")
            where = f"\n  invocation {inv}" if inv else "\n  (refused before publishing)"
            c.print(f"[{outcome_style(code)}]{code}[/]{where}")
            if "error" in answer:
                c.print(f"  {answer['error']['message']}")
            for field in ("dry_run", "result"):
                if field in answer:
                    c.print(f"  {field}:")
                    c.print_json(data=answer[field])
            if not answer.get("settled", True):
                c.print("[yellow]  not settled yet (timed out waiting)[/]")
            if answer.get("final") is False:  # a wait ran out first (ADR 0029)
                c.print("[yellow]  not final yet: the approval is still pending[/]")

        self.value(
            answer_value(answer),
            human,
        )

    def catalog(self, tools: list[dict[str, Any]], version: str) -> None:
        def human(c: Console) -> None:
            t = _table(f"catalog (policy version {version[:12]})")
            t.add_column("tool", no_wrap=True)
            t.add_column("kind", no_wrap=True)
            for col in ("impact", "dry-run", "confirm", "callers", "approvers"):
                t.add_column(col, overflow="fold")
            for tool in tools:
                impact = str(tool.get("impact", ""))
                if tool.get("high_impact_when"):
                    w = tool["high_impact_when"]
                    impact = f"{impact}, high if {w['arg']} ≥ {w['gte']:g}"
                t.add_row(
                    tool["name"],
                    "mutation" if tool.get("mutation") else "read",
                    impact,
                    "yes" if tool.get("require_dry_run") else "no",
                    str(tool.get("confirmation")),
                    ", ".join(tool.get("callers", [])),
                    ", ".join(tool.get("approvers", [])),
                )
            c.print(t)

        self.value(tools, human)

    def simulation(self, report: dict[str, Any]) -> None:
        def human(c: Console) -> None:
            refusals = report.get("limit_refusals") or []
            c.print(
                f"{report['decided']} recorded decisions decided again under "
                f"{report['candidate_version'][:12]}: {report['changed']} would change"
                + (f", {len(refusals)} refused by its limits" if refusals else "")
            )
            if refusals:
                t = _table("calls its limits would have refused")
                for column in ("invocation", "tool", "actor", "limit", "used before"):
                    t.add_column(column, justify="right" if column == "used before" else "left")
                for r in refusals:
                    window = "" if r["window"] == "in_flight" else f" in {r['window']}"
                    t.add_row(
                        escape(r["invocation_id"]), escape(r["tool"]),
                        escape(f"{r['tenant']}/{r['actor']}"), escape(r["limit"]),
                        f"{r['used']} of {r['max']}{window} (+{r['amount']})",
                    )  # fmt: skip
                c.print(t)
            if not report["changed"]:
                return
            for title, column, counts in (
                ("changes by transition", "transition", report["by_transition"]),
                ("changes by tool", "tool", report["by_tool"]),
            ):
                t = _table(title)
                t.add_column(column)
                t.add_column("calls", justify="right")
                for name, count in counts.items():
                    t.add_row(escape(name), str(count))
                c.print(t)
            t = _table("examples")
            t.add_column("invocation")
            t.add_column("transition")
            t.add_column("why")
            for e in report["examples"]:
                t.add_row(escape(e["invocation_id"]), escape(e["transition"]), escape(e["reason"]))
            c.print(t)

        self.value(report, human)

    def pending(self, rows: list[dict[str, Any]]) -> None:
        keys = (
            "invocation_id",
            "tool",
            "tenant",
            "actor",
            "args",
            "dry_run",
            "confirmation",
            "expires_at",
        )
        shaped = [
            {k: r.get(k) for k in keys} | {"partition_key": r.get("partition_key")} for r in rows
        ]

        def human(c: Console) -> None:
            # One block per call: the arguments and the dry-run a person confirms are too
            # wide for table cells in 80 columns.
            c.print(f"[bold]pending approvals ({len(rows)})[/]")
            for r in rows:
                expires = iso_ms(r["expires_at"]) if r.get("expires_at") else "-"
                c.print(r["invocation_id"], soft_wrap=True)
                c.print(
                    f"  [bold]{escape(str(r['tool']))}[/] for "
                    f"{escape(str(r['actor']))}@{escape(str(r['tenant']))}"
                )
                c.print(f"  confirmation: {r['confirmation']}, expires {expires}")
                c.print(f"  args:    {escape(json.dumps(r['args'], sort_keys=True))}")
                c.print(f"  dry-run: {escape(json.dumps(r['dry_run'], sort_keys=True))}")

        self.value(shaped, human)

    def audit(self, rows: list[dict[str, Any]]) -> None:
        def human(c: Console) -> None:
            t = _table(f"audit ({len(rows)} records)")
            t.add_column("invocation", overflow="fold")
            t.add_column("tool", no_wrap=True)
            t.add_column("outcome", no_wrap=True)
            for col in ("proposed_by", "authorized_by"):
                t.add_column(col, overflow="fold")
            for r in rows:
                auth = r.get("authorized_by") or {}
                principal = auth.get("principal") or {}
                approval = auth.get("approval") or {}
                who = (
                    f"{auth.get('decision')} for {principal.get('user')}@{principal.get('tenant')}"
                )
                if approval:
                    who += f", approved by {approval.get('approver')}"
                code = str(r.get("outcome"))
                t.add_row(
                    r["invocation_id"],
                    str(r.get("tool")),
                    f"[{outcome_style(code)}]{code}[/]",
                    str(r.get("proposed_by")),
                    who,
                )
            c.print(t)

        self.value(rows, human)

    def effects(self, rows: list[dict[str, Any]]) -> None:
        def human(c: Console) -> None:
            t = _table(f"side effects ({len(rows)})")
            t.add_column("seq")
            t.add_column("tool", no_wrap=True)
            for col in ("target", "tenant", "invocation", "token"):
                t.add_column(col, overflow="fold")
            for r in rows:
                t.add_row(
                    str(r.get("seq")),
                    r["tool"],
                    str(r["target"]),
                    str(r.get("tenant")),
                    r["invocation_id"],
                    str(r.get("token")),
                )
            c.print(t)

        self.value(rows, human)

    def serving(self, state_dir: Path, pid: int, dev: bool = False) -> None:
        """Serve has started; in text form also how to submit a first proposal."""
        serve_line(
            self.log_format,
            "started",
            f"callgate serve (pid {pid}) on the embedded backend, state in {state_dir}",
            backend="embedded",
            state_dir=str(state_dir),
            pid=pid,
        )
        if self.log_format != "text":
            return
        prog = f"{_program()}{' --dev' if dev else ''} --state-dir {state_dir}"
        if dev:
            lines = [
                f"  development keys in {state_dir / 'keys'}; from a second terminal:",
                f"    TOKEN=$({prog} session issue --user alice --tenant acme --roles support)",
            ]
        else:
            lines = [
                "  sessions: tokens of the issuers in the configuration (callgate config check);"
                " --dev also trusts `callgate session issue`",
                "  from a second terminal, with TOKEN from your identity provider:",
            ]
        lines.append(
            f'    {prog} propose --session "$TOKEN" --tool tickets.read '
            '--args \'{"ticket_id": "T-1"}\''
        )
        for line in lines:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def policy_history(self, value: dict[str, Any]) -> None:
        def human(c: Console) -> None:
            c.print(f"active: {value['active'] or '(the profile file)'}")
            c.print(f"shadow: {value['shadow'] or '(none)'}")
            t = _table("policy history")
            for column in ("when", "action", "version", "who", "why"):
                t.add_column(column)
            for h in value["history"]:
                t.add_row(
                    escape(iso_ms(h["at"])),
                    h["action"],
                    escape(h["version"][:12]),
                    escape(f"{h['author']} ({h['tenant']})"),
                    escape(h["reason"]),
                )
            c.print(t)

        self.value(value, human)

    def shadow_report(self, value: dict[str, Any]) -> None:
        def human(c: Console) -> None:
            c.print(f"{value['differed']} live decisions differed under the shadow version")
            t = _table("differences")
            for column in ("invocation", "tool", "active", "shadow", "why"):
                t.add_column(column)
            for d in value["differences"]:
                t.add_row(
                    escape(d["invocation_id"]),
                    escape(d["tool"]),
                    d["active_outcome"],
                    d["candidate_outcome"],
                    escape(d["reason"]),
                )
            c.print(t)

        self.value(value, human)


def _table(title: str) -> Table:
    """A table that fits an 80-column terminal: rules under the header only, one space
    between cells (into a pipe, as wide as its widest row: ``console``)."""
    return Table(title=title, box=box.SIMPLE_HEAD, padding=0, pad_edge=False)


def _program() -> str:
    """How this shell can run callgate: the bare name when it is on PATH."""
    found = shutil.which("callgate")
    here = Path(sys.argv[0]).resolve()
    if found and Path(found).resolve() == here:
        return "callgate"
    return str(here) if here.name == "callgate" else "callgate"


def answer_value(answer: dict[str, Any]) -> dict[str, Any]:
    """``callgate propose --json`` (and ``POST /v1/proposals``): ``settled`` only when false."""
    return {k: v for k, v in answer.items() if k != "settled"} | (
        {} if answer.get("settled", True) else {"settled": False}
    )
