"""The one report model of every scenario: a `Report` (title, command, machine, sections of
text, a `Table` and `Goal`s) written as Markdown, which is also printed, beside the scenario's
own result Struct as JSON (`write`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gateway_bench.machine import Machine

MARKDOWN, JSON = "report.md", "report.json"
VERDICT = {True: "met", False: "**not met**", None: "not measured"}


class Goal(msgspec.Struct):
    """A goal judged on a run: met (True), not met (False), or not measured (None: quick mode,
    a target skipped, a figure missing)."""

    name: str
    requirement: str
    measured: str
    passed: bool | None


@dataclass
class Table:
    columns: list[str]
    rows: list[list[object]] = field(default_factory=list)  # each cell shown with str()

    def lines(self) -> list[str]:
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        return lines + ["| " + " | ".join(map(str, row)) + " |" for row in self.rows]


@dataclass
class Section:
    heading: str = ""  # "## heading"; none: the section goes on under the previous one
    text: list[str] = field(default_factory=list)  # paragraphs or bullets above the table
    table: Table | None = None
    goals: list[Goal] = field(default_factory=list)  # a table when they say what was measured

    def lines(self) -> list[str]:
        lines = [f"## {self.heading}", ""] if self.heading else []
        lines += [*self.text, ""] if self.text else []
        lines += [*self.table.lines(), ""] if self.table is not None else []
        if any(g.requirement or g.measured for g in self.goals):
            rows: list[list[object]] = [
                [g.name, g.requirement, g.measured, VERDICT[g.passed]] for g in self.goals
            ]
            lines += [*Table(["goal", "requirement", "measured", "result"], rows).lines(), ""]
        elif self.goals:
            lines += [*(f"- {g.name}: {VERDICT[g.passed]}" for g in self.goals), ""]
        return lines


@dataclass
class Report:
    title: str
    command: str
    machine: Machine
    sections: list[Section]
    intro: list[str] = field(default_factory=list)  # under the command: run, machine, settings

    def markdown(self) -> str:
        intro = self.intro or [self.machine.summary]
        lines = [f"# {self.title}", "", f"`{self.command}`", "", *intro, ""]
        lines += [line for section in self.sections for line in section.lines()]
        return "\n".join(lines).rstrip("\n")


def write(result: msgspec.Struct, report: Report, out: Path, name: str = "report") -> str:
    """`result` as out/NAME.json and `report` as out/NAME.md; the Markdown."""
    text = report.markdown()
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_bytes(msgspec.json.format(msgspec.json.encode(result)) + b"\n")
    (out / f"{name}.md").write_text(text + "\n")
    return text


def cell(value: float | None, digits: int = 1) -> str:
    """A figure as a table shows it: thousands separated, `-` for none."""
    return "-" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None, reference: float | None) -> str:
    return "-" if value is None or not reference else f"{value / reference:.2f}"
