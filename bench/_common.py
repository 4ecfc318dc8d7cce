"""What the benchmark scripts share: where the database comes from, a throwaway database per
run, a deterministic generator of realistic agent transcripts, and small timing helpers.

Not part of the library: these scripts print figures, they are not tests.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import math
import os
import platform
import pstats
import random
import secrets
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from psycopg.conninfo import make_conninfo
from rich.console import Console
from sqlalchemy.engine import URL

from autoctx import (
    AutoContextClient,
    AutoContextConfig,
    Msg,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from autoctx._store.database import (
    ENV_URL,
    create_engine,
    ensure_database,
    normalize_url,
    resolve_url,
    upgrade,
)
from autoctx._tokens import TokenCounter

# ---------------------------------------------------------------------------------------------
# The database
# ---------------------------------------------------------------------------------------------


def add_database_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help=(
            "PostgreSQL server to benchmark against; its database is only used to create and "
            f"drop a throwaway one. Default: ${ENV_URL}, else the embedded PostgreSQL."
        ),
    )


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """--autoctx-config: AutoContextConfig fields besides max_tokens, as a JSON object, checked
    by building a config (an unknown field or a bad value is refused with the config's own
    message). Stored as ``args.autoctx_config``, a dict; the default runs the defaults."""
    parser.add_argument(
        "--autoctx-config",
        type=_config_fields,
        default={},
        metavar="JSON",
        help="autoctx's AutoContextConfig fields besides max_tokens, as a JSON object (e.g. "
        "'{\"target_ratio\": 0.1}'); the default is the defaults",
    )


def _config_fields(text: str) -> dict[str, Any]:
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(fields, dict) or "max_tokens" in fields:
        raise argparse.ArgumentTypeError("a JSON object of fields other than max_tokens")
    try:
        AutoContextConfig(max_tokens=32_000, **fields)
    except (TypeError, ValueError) as exc:  # an unknown field, a bad value
        raise argparse.ArgumentTypeError(str(exc)) from None
    return fields


def admin_url(database_url: str | None) -> URL:
    """The flag, else AUTOCTX_DATABASE_URL, else the embedded server (started if needed)."""
    url: URL = normalize_url(database_url) if database_url else resolve_url(None)
    return url


def psycopg_conninfo(url: URL) -> str:
    """A libpq conninfo for a SQLAlchemy URL (the embedded server's socket is a query param)."""
    params: dict[str, Any] = {"dbname": url.database}
    host = url.host or url.query.get("host")
    if host:
        params["host"] = host
    if url.port:
        params["port"] = url.port
    if url.username:
        params["user"] = url.username
    if url.password:
        params["password"] = url.password
    return make_conninfo(**params)


@dataclass(frozen=True, slots=True)
class BenchDatabase:
    url: URL
    name: str
    server_version: str

    @property
    def conninfo(self) -> str:
        return psycopg_conninfo(self.url)


def _drop_database(admin: URL, name: str) -> None:
    engine = create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            # FORCE: a pooled connection left behind by a crashed step must not keep it alive.
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


@contextlib.contextmanager
def fresh_database(
    database_url: str | None, prefix: str, *, template: str | None = None
) -> Iterator[BenchDatabase]:
    """A new database migrated to head (a copy of database `template` when given), dropped at
    the end (even on error or Ctrl-C)."""
    admin = admin_url(database_url)
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"
    ensure_database(admin, name, template=f'"{template}"' if template else None)
    url = admin.set(database=name)
    try:
        engine = create_engine(url, poolclass=sa.NullPool)
        try:
            upgrade(engine)
            with engine.connect() as conn:
                version = str(conn.execute(sa.text("show server_version")).scalar())
        finally:
            engine.dispose()
        yield BenchDatabase(url, name, version.split()[0])
    finally:
        # autoctx keeps one pool per URL per process; it must let go before the drop.
        AutoContextClient.close_shared()
        _drop_database(admin, name)


def machine_description(db: BenchDatabase) -> str:
    return (
        f"{os.cpu_count()} cores ({platform.machine()}), Python {platform.python_version()}, "
        f"PostgreSQL {db.server_version}"
    )


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


@dataclass
class Stopwatch:
    """Accumulates the time spent in named parts."""

    totals: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def __getitem__(self, name: str) -> float:
        return self.totals.get(name, 0.0)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, timed into `name` (for patching a module attribute or a method)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - started)

        return timed


@contextlib.contextmanager
def patched(target: Any, attribute: str, replacement: Any) -> Iterator[None]:
    """Swap an attribute for the duration of a block (used to time library internals)."""
    original = getattr(target, attribute)
    setattr(target, attribute, replacement)
    try:
        yield
    finally:
        setattr(target, attribute, original)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank on sorted values, as in most latency reports."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def secs(seconds: float) -> str:
    return f"{seconds:,.2f} s"


def raw_connection(db: BenchDatabase) -> psycopg.Connection[Any]:
    return psycopg.connect(db.conninfo)


# ---------------------------------------------------------------------------------------------
# Realistic agent transcripts
# ---------------------------------------------------------------------------------------------

_WORDS = tuple(
    " ".join(
        (
            "the request config service cache worker retry timeout index module handler queue",
            "token user session build deploy test failing passing value path branch commit",
            "schema table column migration endpoint response latency error warning missing",
            "expected found update install package version release header payload client server",
            "socket port status check result output input file directory function class method",
            "argument default option flag",
        )
    ).split(" ")
)
_MODULES = ("core", "api", "db", "auth", "utils", "models", "views", "tasks", "cli", "io")
_FUNCS = ("load", "save", "parse", "render", "fetch", "apply", "merge", "close", "open", "run")
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARNING", "ERROR")
_STATUSES = ("ok", "pending", "failed", "running", "done")
_TOOLS = ("read_file", "run_shell", "grep", "http_get", "list_dir", "write_file", "python")
#: What each read-only tool returns, by the kind of its line pool (see `TranscriptGenerator`).
TOOL_OUTPUT_KINDS: dict[str, str] = {
    "read_file": "code",
    "run_shell": "log",
    "grep": "code",
    "http_get": "json",
    "list_dir": "listing",
    "python": "log",
}


def _sentence(r: random.Random, words: int) -> str:
    text = " ".join(r.choice(_WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def _path(r: random.Random) -> str:
    return f"src/{r.choice(_MODULES)}/{r.choice(_FUNCS)}_{r.randrange(100)}.py"


def _line_pools(r: random.Random, size: int) -> dict[str, list[str]]:
    """Lines of code, logs, JSON, listings and prose that tool outputs are assembled from;
    varied enough that the tokenizer does real work (no repeated-string shortcut)."""
    code, logs, rows, listing, prose = [], [], [], [], []
    for i in range(size):
        f, m = r.choice(_FUNCS), r.choice(_MODULES)
        code.append(
            r.choice(
                (
                    f"def {f}_{i}(self, {r.choice(_WORDS)}: int = {r.randrange(1000)}) -> dict:",
                    f"    {r.choice(_WORDS)}_{i} = {m}.{f}({r.choice(_WORDS)}, {r.randrange(99)})",
                    f"    return self.{r.choice(_WORDS)}[{r.randrange(50)}]",
                    f"from {m}.{r.choice(_MODULES)} import {f}_{r.randrange(40)}",
                    f"    # {_sentence(r, r.randrange(4, 12))}",
                    f"class {f.capitalize()}{m.capitalize()}{i}(Base):",
                    f"        if {r.choice(_WORDS)} is None: raise KeyError({r.randrange(99)})",
                )
            )
        )
        logs.append(
            f"2025-11-{r.randrange(1, 29):02d}T{r.randrange(24):02d}:{r.randrange(60):02d}:"
            f"{r.randrange(60):02d}.{r.randrange(1000):03d}Z {r.choice(_LEVELS)} [{m}.{f}] "
            f"{_sentence(r, r.randrange(3, 10))} id={_hex(r, 8)} took={r.randrange(900)}ms"
        )
        rows.append(
            json.dumps(
                {
                    "id": r.randrange(10**6),
                    "name": f"{r.choice(_WORDS)}-{r.randrange(1000)}",
                    "status": r.choice(_STATUSES),
                    "url": f"https://api.example.com/v1/{r.choice(_WORDS)}/{r.randrange(10**5)}",
                }
            )
            + ","
        )
        listing.append(
            f"-rw-r--r-- 1 agent agent {r.randrange(10**6):>8} Nov {r.randrange(1, 29):2d} "
            f"{r.randrange(24):02d}:{r.randrange(60):02d} {_path(r)}"
        )
        prose.append(_sentence(r, r.randrange(6, 24)))
    return {"code": code, "log": logs, "json": rows, "listing": listing, "prose": prose}


def _hex(r: random.Random, n: int) -> str:
    return "".join(r.choice("0123456789abcdef") for _ in range(n))


_OUTPUT_KIND = {
    "read_file": "code",
    "run_shell": "log",
    "grep": "code",
    "http_get": "json",
    "list_dir": "listing",
    "write_file": "log",
    "python": "log",
}


class TranscriptGenerator:
    """Deterministic, realistic agent transcripts as autoctx `Msg`s.

    Rounds of: a user question; a few steps, each an assistant message with one tool call or
    several in parallel (sometimes with a line of text) followed by one tool message per call;
    a final answer. Tool output sizes follow a log-normal law clipped to [100 chars, 20 KB]: most
    a few hundred characters, a long tail of large ones (about 5% over 5,120 characters).
    """

    def __init__(
        self,
        seed: int = 42,
        *,
        tool_output_median: int = 800,
        tool_output_sigma: float = 1.1,
        min_tool_chars: int = 100,
        max_tool_chars: int = 20_000,
    ) -> None:
        self.r = random.Random(seed)
        self.median = tool_output_median
        self.sigma = tool_output_sigma
        self.min_chars = min_tool_chars
        self.max_chars = max_tool_chars
        self.pools = _line_pools(random.Random(seed + 1), 3000)
        self._call = 0

    # -- text -----------------------------------------------------------------------------------

    def text(self, kind: str, chars: int) -> str:
        """About `chars` characters of `kind` lines (exactly `chars`, cut at the end)."""
        pool = self.pools[kind]
        parts: list[str] = []
        total = 0
        while total < chars:
            line = self.r.choice(pool)
            parts.append(line)
            total += len(line) + 1
        return "\n".join(parts)[:chars]

    def tool_output_size(self) -> int:
        size = self.r.lognormvariate(math.log(self.median), self.sigma)
        return int(min(self.max_chars, max(self.min_chars, size)))

    # -- messages -------------------------------------------------------------------------------

    def user(self) -> Msg:
        chars = self.r.choice((60, 120, 200, 400, 800)) + self.r.randrange(60)
        body = self.text("prose", chars)
        if self.r.random() < 0.1:  # a pasted stack trace or snippet
            body += "\n```\n" + self.text("code", self.r.randrange(300, 2000)) + "\n```"
        return Msg.user(body)

    def _arguments(self, tool: str) -> str:
        r = self.r
        args: dict[str, Any]
        if tool == "read_file":
            args = {"path": _path(r)}
        elif tool == "run_shell":
            args = {"cmd": f"pytest -q tests/test_{r.choice(_MODULES)}.py -k {r.choice(_FUNCS)}"}
        elif tool == "grep":
            args = {"pattern": f"{r.choice(_FUNCS)}_[0-9]+", "path": "src/"}
        elif tool == "http_get":
            args = {"url": f"https://api.example.com/v1/{r.choice(_WORDS)}?page={r.randrange(9)}"}
        elif tool == "list_dir":
            args = {"path": f"src/{r.choice(_MODULES)}"}
        elif tool == "write_file":
            args = {"path": _path(r), "content": self.text("code", r.randrange(80, 1200))}
        else:
            args = {"code": self.text("code", r.randrange(60, 400))}
        return json.dumps(args)

    def step(self) -> list[Msg]:
        """One assistant message with 1 to 4 calls (30% parallel) and their tool messages."""
        r = self.r
        n_calls = 1 if r.random() < 0.7 else r.randrange(2, 5)
        calls = []
        for _ in range(n_calls):
            self._call += 1
            tool = r.choice(_TOOLS)
            calls.append(ToolUseBlock(f"call_{self._call}", tool, self._arguments(tool)))
        text = _sentence(r, r.randrange(5, 20)) if r.random() < 0.3 else None
        out = [Msg.assistant(text, calls)]
        for call in calls:
            output = self.text(_OUTPUT_KIND[call.name], self.tool_output_size())
            out.append(Msg("tool", (ToolResultBlock(call.id, output, call.name),)))
        return out

    def answer(self) -> Msg:
        chars = self.r.choice((200, 400, 800, 1500, 3000)) + self.r.randrange(100)
        return Msg.assistant(self.text("prose", chars))

    def round(self, size: int) -> list[Msg]:
        """A finished round of exactly `size` >= 2 messages: user, steps, final answer."""
        out = [self.user()]
        budget = size - 2
        while budget >= 2:
            step = self.step()
            if len(step) > budget:
                step = step[: 1 + (budget - 1)]
                step = self._trim_step(step)
            out.extend(step)
            budget -= len(step)
        if budget == 1:
            # A step needs two messages; the answer comes in two parts instead.
            out.append(Msg.assistant(_sentence(self.r, 12)))
        out.append(self.answer())
        return out

    @staticmethod
    def _trim_step(step: list[Msg]) -> list[Msg]:
        """Keep only the calls whose results fit (results answer calls one to one, in order)."""
        head, results = step[0], step[1:]
        kept = {m.tool_results[0].tool_use_id for m in results}
        calls = tuple(c for c in head.tool_uses if c.id in kept)
        text = [b for b in head.content if isinstance(b, TextBlock)]
        return [Msg("assistant", (*text, *calls)), *results]

    def round_size(self) -> int:
        """Messages in a round: mostly 4 to 30, sometimes a long task of a hundred or more."""
        if self.r.random() < 0.05:
            return self.r.randrange(60, 200)
        return self.r.randrange(2, 30)

    def messages(self, n: int) -> list[Msg]:
        """Exactly `n` messages of finished rounds (the last one ends with a final answer),
        except that n == 1 gives a lone user question."""
        out: list[Msg] = []
        while len(out) < n:
            remaining = n - len(out)
            size = self.round_size()
            if remaining - size < 2:
                size = remaining  # the last round takes the rest (never leaves a lone message)
            if size < 2:
                out.append(self.user())
                break
            out.extend(self.round(size))
        return out


# ---------------------------------------------------------------------------------------------
# Workload pieces shared by bounded.py and agent_cost.py
# ---------------------------------------------------------------------------------------------


class Texts:
    """Text of about N tokens, from the generator's line pools.

    The brief of each workload is in tokens; the pools differ in characters per token (prose
    about 5, JSON rows about 3), so each kind's ratio is measured once on a sample.
    """

    def __init__(self, gen: TranscriptGenerator) -> None:
        self.gen = gen
        counter = TokenCounter("gpt-4o")
        # A fixed seed, not the run's: the calibration must not move with --seed.
        sample = TranscriptGenerator(7)
        self.chars_per_token: dict[str, float] = {}
        for kind in sample.pools:
            text = sample.text(kind, 100_000)
            self.chars_per_token[kind] = len(text) / counter.count(text)

    def text(self, kind: str, tokens: int) -> str:
        return self.gen.text(kind, max(1, round(tokens * self.chars_per_token[kind])))


def tool_arguments(r: random.Random, tool: str) -> str:
    if tool in ("read_file", "list_dir"):
        return json.dumps({"path": f"src/mod_{r.randrange(40)}/file_{r.randrange(200)}.py"})
    if tool == "run_shell":
        return json.dumps({"cmd": f"pytest -q tests/test_{r.randrange(60)}.py"})
    if tool == "grep":
        return json.dumps({"pattern": f"def f_{r.randrange(500)}", "path": "src/"})
    if tool == "http_get":
        return json.dumps({"url": f"https://api.example.com/v1/items?page={r.randrange(50)}"})
    return json.dumps({"code": f"print(sum(range({r.randrange(10**6)})))"})


class Calls:
    """Call ids unique within a session."""

    def __init__(self) -> None:
        self.n = 0

    def new(self, r: random.Random) -> ToolUseBlock:
        self.n += 1
        tool = r.choice(tuple(TOOL_OUTPUT_KINDS))
        return ToolUseBlock(f"call_{self.n}", tool, tool_arguments(r, tool))


def tool_turn(gen: TranscriptGenerator, texts: Texts, calls: Calls) -> tuple[str, list[Any]]:
    """One Agents-SDK-like turn: the user's text, then the model's responses, each a list of
    calls (1 or 2 in all, parallel or one by one) or a final text."""
    r = gen.r
    user = gen.user().text
    made = [calls.new(r) for _ in range(r.choice((1, 2)))]
    responses: list[Any] = [made] if len(made) == 1 or r.random() < 0.5 else [[c] for c in made]
    responses.append(gen.answer().text)
    return user, responses


def trajectories(directory: Path) -> Iterator[dict[str, Any]]:
    """The OpenAI-format chat messages of the trajectories in `directory`, file after file in
    name order: each `.json` file a list of messages or {"messages": [...]}, each `.jsonl` file
    one such list (or one message) per line."""
    files = sorted(p for p in directory.iterdir() if p.suffix in (".json", ".jsonl"))
    if not files:
        raise SystemExit(f"--trajectories: no .json or .jsonl file in {directory}")
    for path in files:
        if path.suffix == ".json":
            documents = [json.loads(path.read_text())]
        else:
            lines = path.read_text().splitlines()
            documents = [json.loads(line) for line in lines if line.strip()]
        for data in documents:
            if isinstance(data, dict) and "role" in data:
                yield data  # a JSONL line that is one message
                continue
            messages = data.get("messages") if isinstance(data, dict) else data
            if not isinstance(messages, list):
                raise SystemExit(f"{path}: expected a list of messages or {{'messages': [...]}}")
            yield from messages


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def describe_messages(msgs: Sequence[Msg]) -> str:
    """One line on what was generated: counts by role, sizes, the tail of large outputs."""
    sizes = [m.payload_chars for m in msgs]
    tools = sum(1 for m in msgs if m.role == "tool")
    large = sum(1 for s in sizes if s > 5120)
    return (
        f"{len(msgs):,} messages ({tools:,} tool results), {sum(sizes) / 1e6:,.1f} M chars, "
        f"median {int(statistics.median(sizes)):,} chars, max {max(sizes):,}, "
        f"{large:,} over 5,120 chars"
    )


def print_profile(console: Console, profiler: cProfile.Profile, title: str) -> None:
    """A profile's heaviest functions, by own time and by cumulative time."""
    console.rule(title)
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
