"""What ``eagle3-raw eval`` reports: each server's answers summarized, as JSON and as a table.

Per server, overall and in each bucket of the groups of :func:`eagle3_raw.acceptance.summarize`
(turn, prompt length, output length, the source's category where it has one, finish reason):
acceptance length (generated tokens over verify steps, summed over the requests measured), accept
rate (accepted drafts over proposed), the histogram of accepted drafts per verify step, and
generation speed: generated tokens over the requests' latencies summed (what one request sees,
queueing in the server included). Overall, beside it, the throughput: generated tokens over the
replay's wall time, at the ``--max-in-flight`` it ran with.

A record's output length is what the server generated on the replay, its finish reason the
replay's; turn, prompt length and category are the set's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eagle3_raw.acceptance import Stats, Summary, summarize
from eagle3_raw.evaluate.replay import Answer, Replay
from eagle3_raw.printable import printable

if TYPE_CHECKING:
    from rich.table import Table


@dataclass(frozen=True)
class ServerReport:
    """One server's replay, summarized."""

    replay: Replay
    summary: Summary
    speed: Mapping[str, Mapping[str, float | None]]
    """Group -> bucket label -> generated tokens/s (the overall one under ``"overall"``, ``"all"``)."""

    @property
    def url(self) -> str:
        return self.replay.url

    @property
    def throughput(self) -> float | None:
        """Generated tokens per second of wall time over the whole replay."""
        tokens = sum(a.completion_tokens for a in self.replay.answers)
        return tokens / self.replay.seconds if self.replay.seconds > 0 else None

    def failures(self) -> dict[str, int]:
        """Reason -> points that got no answer."""
        counts: dict[str, int] = {}
        for failure in self.replay.failures:
            counts[failure.reason] = counts.get(failure.reason, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the summary's own form, each stats mapping with its ``tokens_per_s``."""
        summary = self.summary.to_dict()
        overall = {**summary["overall"], "tokens_per_s": self.speed["overall"]["all"]}
        groups = {
            group: {
                label: {**stats, "tokens_per_s": self.speed[group].get(label)}
                for label, stats in buckets.items()
            }
            for group, buckets in summary["groups"].items()
        }
        return {
            "url": self.url,
            "drafter": dict(self.replay.drafter),
            "answered": len(self.replay.answers),
            "failed": self.failures(),
            "seconds": self.replay.seconds,
            "throughput_tokens_per_s": self.throughput,
            "overall": overall,
            "groups": groups,
        }


def records(answers: Sequence[Answer]) -> list[dict[str, Any]]:
    """The records :func:`~eagle3_raw.acceptance.summarize` reads, one per answer."""
    return [
        {
            "turn": a.point.turn, "prompt_len": len(a.point.prompt_ids), "output_len": a.completion_tokens,
            "finish_reason": a.finish_reason, "category": a.point.category,
            "completion_tokens": a.completion_tokens, **a.spec,
        }
        for a in answers
    ]  # fmt: skip


def server_report(replay: Replay) -> ServerReport:
    """``replay`` summarized (see the module docstring)."""
    found = records(replay.answers)
    return ServerReport(replay, summarize(found), _speeds(replay.answers, found))


def _speeds(answers: Sequence[Answer], found: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Group -> bucket -> generated tokens over summed latency, every answer counted (measured or
    not), bucketed exactly as ``summarize`` buckets: each record where it falls when summarized alone."""
    members: dict[str, dict[str, list[Answer]]] = {}
    for answer, record in zip(answers, found, strict=True):
        for group, buckets in summarize([record]).groups.items():
            for label in buckets:
                members.setdefault(group, {}).setdefault(label, []).append(answer)
    speeds: dict[str, dict[str, float | None]] = {"overall": {"all": speed(answers)}}
    for group, labelled in members.items():
        speeds[group] = {label: speed(bucket) for label, bucket in labelled.items()}
    return speeds


def speed(answers: Sequence[Answer]) -> float | None:
    """Generated tokens per second of latency over ``answers`` (None without any latency)."""
    seconds = sum(a.latency for a in answers)
    return sum(a.completion_tokens for a in answers) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class Report:
    """Every server's report on the same points."""

    label: str
    split: str
    points: int
    sampling: str
    """``greedy`` or ``recipe``."""
    servers: tuple[ServerReport, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "set": self.label,
            "split": self.split,
            "points": self.points,
            "sampling": self.sampling,
            "servers": [s.to_dict() for s in self.servers],
        }


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def tables(report: Report, *, stacked: bool = False) -> list[Table]:
    """The terminal tables: the servers and their figures, then acceptance by group (servers side
    by side, or one table per server when ``stacked``: a narrow terminal), then the histogram of
    accepted drafts per verify step."""
    names = server_names(report)
    pairs = list(zip(names, report.servers, strict=True))
    groups = [_groups_table(report, [pair]) for pair in pairs] if stacked else [_groups_table(report, pairs)]
    return [_servers_table(report), _figures_table(report), *groups, _histogram_table(report)]


def server_names(report: Report) -> list[str]:
    return [chr(ord("A") + i) if i < 26 else str(i) for i in range(len(report.servers))]


def _servers_table(report: Report) -> Table:
    from rich import box
    from rich.table import Table

    title = f"{printable(report.label)}: {report.points:,} prompts, {report.sampling} sampling"
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("")
    table.add_column("server", overflow="fold")  # a URL cut short would name no server
    table.add_column("drafter", overflow="fold")
    for name, server in zip(server_names(report), report.servers, strict=True):
        table.add_row(name, printable(server.url), _drafter(server.replay.drafter))
    return table


def _figures_table(report: Report) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(title="overall", box=box.SIMPLE_HEAD)
    table.add_column("")
    for column in ("answered", "failed", "accept length", "accept rate", "tokens/s", "throughput"):
        table.add_column(column, justify="right")
    for name, server in zip(server_names(report), report.servers, strict=True):
        overall = server.summary.overall
        speed = server.speed["overall"]["all"]
        table.add_row(
            name, f"{len(server.replay.answers):,}", f"{len(server.replay.failures):,}",
            _number(overall.accept_length), _rate(overall.accept_rate), _number(speed, 0),
            _number(server.throughput, 0),
        )  # fmt: skip
    return table


def _drafter(drafter: Mapping[str, Any]) -> str:
    """The algorithm and draft model a server reports (a server's text: escaped)."""
    named = [
        str(drafter[k]) for k in ("speculative_algorithm", "speculative_draft_model_path") if drafter.get(k)
    ]
    return printable(" ".join(named), limit=120)


def _groups_table(report: Report, servers: Sequence[tuple[str, ServerReport]]) -> Table:
    from rich import box
    from rich.table import Table

    title = "acceptance length (accept rate) and tokens/s by group"
    if len(servers) == 1 and len(report.servers) > 1:
        title += f": {servers[0][0]}"
    table = Table(title=title, box=box.SIMPLE_HEAD)
    table.add_column("group", no_wrap=True)
    table.add_column("bucket")
    for name, _ in servers:
        table.add_column(f"{name} rows", justify="right")
        table.add_column(f"{name} length (rate)", justify="right")
        table.add_column(f"{name} tok/s", justify="right")
    for group, labels in _group_labels(report).items():
        for i, label in enumerate(labels):
            cells = []
            for _, server in servers:
                stats = server.summary.groups.get(group, {}).get(label)
                cells += _cells(stats, server.speed.get(group, {}).get(label))
            table.add_row(group if i == 0 else "", printable(label, limit=40), *cells)
        table.add_section()
    return table


def _cells(stats: Stats | None, speed: float | None) -> list[str]:
    if stats is None:
        return ["0", "-", "-"]
    return [
        f"{stats.rows:,}",
        f"{_number(stats.accept_length)} ({_rate(stats.accept_rate)})",
        _number(speed, 0),
    ]


def _group_labels(report: Report) -> dict[str, list[str]]:
    """Group -> its bucket labels over every server, in the first server's order, then any others."""
    labels: dict[str, list[str]] = {}
    for server in report.servers:
        for group, buckets in server.summary.groups.items():
            known = labels.setdefault(group, [])
            known += [label for label in buckets if label not in known]
    return labels


def _histogram_table(report: Report) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(title="verify steps by accepted drafts (share of each server's steps)", box=box.SIMPLE_HEAD)
    table.add_column("accepted drafts", justify="right")
    names = server_names(report)
    for name in names:
        table.add_column(name, justify="right")
    width = max((len(s.summary.overall.histogram) for s in report.servers), default=0)
    for k in range(width):
        row = []
        for server in report.servers:
            histogram = server.summary.overall.histogram
            steps = sum(histogram)
            count = histogram[k] if k < len(histogram) else 0
            row.append(f"{count:,} ({100 * count / steps:.1f}%)" if steps else "-")
        table.add_row(str(k), *row)
    return table
