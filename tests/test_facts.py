"""The fact extractor (docs/design.md §6): pure, bounded, deterministic; property tests over
random and adversarial text (huge inputs, ReDoS-shaped strings, facts across a clip)."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoctx import Msg
from autoctx._messages import ToolResultBlock, ToolUseBlock
from autoctx._strategies.facts import (
    CONSTRAINT,
    DEFAULT_LIMIT,
    IDENTIFIER,
    LOCATION,
    QUOTED,
    SCAN_HEAD,
    SCAN_TAIL,
    SCAN_TOTAL,
    VALUE,
    _split_index_lines,
    extract,
    facts_of,
    index_line_text,
    missing,
    normalize,
)

PLANTED = (
    "You must never touch /etc/prod/app.yaml. Always run the linter first.\n"
    "The deploy of build req-8f3a21 failed with FileNotFoundError at src/app/main.py, commit "
    "3f9a2c1e; see https://ci.example.com/runs/991. It used timeout=30 and took 250 ms; the "
    'error said "disk quota exceeded".'
)


def texts(found: tuple[object, ...]) -> list[str]:
    return [f.text for f in found]  # type: ignore[attr-defined]


def test_each_kind_is_found_and_ranked_constraints_and_identifiers_first() -> None:
    found = extract([("user", PLANTED)])
    by_text = {f.text: f.rank for f in found}
    assert by_text["You must never touch /etc/prod/app.yaml"] == CONSTRAINT
    assert by_text["Always run the linter first"] == CONSTRAINT
    assert by_text["req-8f3a21"] == IDENTIFIER
    assert by_text["FileNotFoundError"] == IDENTIFIER
    assert by_text["3f9a2c1e"] == IDENTIFIER
    assert by_text["src/app/main.py"] == LOCATION
    assert by_text["https://ci.example.com/runs/991"] == LOCATION
    assert by_text["timeout=30"] == VALUE
    assert by_text["250 ms"] == VALUE
    assert by_text["disk quota exceeded"] == QUOTED
    # The path inside the constraint is kept by whatever keeps the constraint: not twice.
    assert "/etc/prod/app.yaml" not in by_text
    ranks = [f.rank for f in found]
    assert ranks == sorted(ranks)


def test_prose_outranks_the_exchanges_whose_parts_take_turns() -> None:
    """The prose's facts first; then a call's arguments and the tools' outputs take turns,
    each part's best fact (by rank) before any part's second: the dump's first identifier
    comes before the call's path, and its second after it."""
    dump = "\n".join(f"def handler_{k}(x): return {k}" for k in range(100))
    found = texts(
        facts_of(
            [
                Msg.user("Read /srv/app/settings.py please."),
                Msg.assistant(None, [ToolUseBlock("c1", "read", '{"path": "conf/db.toml"}')]),
                Msg.tool("c1", dump),
            ],
            limit=4,
        )
    )
    assert found == ["/srv/app/settings.py", "handler_0", "conf/db.toml", "handler_1"]


def test_constraints_come_from_the_users_messages_and_quotes_from_prose_only() -> None:
    found = texts(
        facts_of(
            [
                Msg.assistant("You must restart the worker."),
                Msg.user("Never push to main on Fridays."),
                Msg.tool("call_1", '{"status": "ok", "path": "/srv/data/a.csv"}'),
            ]
        )
    )
    assert "Never push to main on Fridays" in found
    assert "You must restart the worker" not in found
    assert "status" not in found and "ok" not in found  # JSON keys and values are no quotes
    assert "/srv/data/a.csv" in found


def test_constraints_in_other_languages() -> None:
    found = texts(
        extract(
            [
                ("user", "Du darfst nicht die Datenbank löschen."),
                ("user", "Ne touchez jamais au fichier de production."),
                ("user", "Nunca borres los registros."),
            ]
        )
    )
    assert len(found) == 3 and all(f[0].isupper() for f in found)


def test_a_calls_arguments_are_read_as_values() -> None:
    msgs = [
        Msg.assistant(
            None, [ToolUseBlock("c1", "read", '{"path": "/srv/app/config.toml", "lines": 40}')]
        )
    ]
    assert {"/srv/app/config.toml", "lines=40"} <= set(texts(facts_of(msgs)))


def test_normalization_matches_case_whitespace_quotes_and_separators() -> None:
    found = extract([("user", 'Open C:\\Users\\Ann\\notes.txt and "Keep  It Short" please.')])
    assert missing(found, "opened c:/users/ann/NOTES.TXT; keep it short") == []
    assert normalize("  A\t'B'\\c  ") == "a b/c"
    assert [f.text for f in missing(found, "nothing here")] == texts(found)


def test_the_limit_keeps_the_best_ranked() -> None:
    text = " ".join(f"path/n{k}.py" for k in range(200)) + "\nYou must keep port 5432 open."
    found = extract([("user", text)], limit=5)
    assert len(found) == 5
    assert found[0].rank == CONSTRAINT
    assert extract([("user", text)], limit=0) == ()
    assert len(extract([("user", text)])) == DEFAULT_LIMIT


# -- properties ---------------------------------------------------------------------------------

_ALPHABET = st.sampled_from(
    [*list("abcXYZ019 ./\\-_=:\"'`\n\t,;()[]{}<>!?"), "must ", "Error", "http://", " ms", "é"]
)
_TEXT = st.lists(_ALPHABET, max_size=400).map("".join)
_SOURCES = st.sampled_from(["user", "assistant", "system", "arguments", "output"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_SOURCES, _TEXT), max_size=6), st.integers(0, 40))
def test_facts_are_verbatim_bounded_ranked_and_deterministic(
    parts: list[tuple[str, str]], limit: int
) -> None:
    found = extract(parts, limit)  # type: ignore[arg-type]
    assert len(found) <= limit
    constraints = [f.rank == CONSTRAINT for f in found]
    assert constraints == sorted(constraints, reverse=True)  # the user's constraints first
    assert len({f.key for f in found}) == len(found)
    for f in found:
        assert any(f.text in text for _, text in parts), f.text
        assert f.key == normalize(f.text) and len(f.key) >= 3 and len(f.text) <= 200
        assert "context_offload" not in f.text.casefold()
    assert extract(parts, limit) == found  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["/srv/data/file-2024.csv", "req-8f3a21", "https://x.io/a/b", "timeout=300"]),
    st.integers(-40, 40),
    st.sampled_from(["head", "tail"]),
    st.sampled_from(["a", "b c ", "x,y;", "\n"]),
)
def test_a_fact_across_a_clip_is_whole_or_absent(
    fact: str, offset: int, cut: str, filler: str
) -> None:
    """A part longer than the scan is read as its head and its tail: a fact that straddles
    either cut is never returned as a fragment."""
    size = SCAN_HEAD + SCAN_TAIL + 50_000
    fill = (filler * size)[:size]
    at = SCAN_HEAD + offset if cut == "head" else size - SCAN_TAIL + offset
    text = fill[: at - len(fact) // 2] + " " + fact + " " + fill[at - len(fact) // 2 :]
    for f in extract([("output", text)]):
        key = normalize(fact)
        assert not (f.key != key and (key.startswith(f.key) or key.endswith(f.key))), f.text
        assert f.text in text


def test_a_fact_near_a_clip_but_inside_it_is_found() -> None:
    size = SCAN_HEAD + SCAN_TAIL + 10_000
    text = "a " * (size // 2)
    text = "lead /srv/x/early.log " + text + " ERR-4242 trail"
    found = texts(extract([("output", text)]))
    assert "/srv/x/early.log" in found and "ERR-4242" in found


# ReDoS shapes: long runs of what each pattern repeats, with nothing that completes a match.
_ADVERSARIAL = [
    "a" * 1_000_000,
    "/a" * 500_000,
    "a/" * 500_000,
    "A" * 1_000_000,
    '"' * 1_000_000,
    "1" * 1_000_000,
    "x=" * 500_000,
    "a-1" * 300_000,
    "Error" * 200_000,
    "must " * 200_000,
    "'a " * 300_000,
    "aA0_-" * 200_000,
    ("x" * 15 + "Error ") * 60_000,
    "a." * 500_000,
    "1.1." * 250_000,
    "http://" * 100_000,
    "\u201c" * 100_000,
    ("a" * 79 + "/") * 10_000,
    "E" + "A" * 999_999,
]


def test_huge_and_redos_shaped_inputs_stay_bounded() -> None:
    """Every pattern's repetitions are bounded and delimited, and at most `SCAN_TOTAL`
    characters are read: ten parts of each shape, about ten megabytes, are extracted at the
    cost of ordinary text. The ceiling is generous (this is no benchmark): catastrophic
    backtracking on any one of them would take hours."""
    started = time.monotonic()
    for shape in _ADVERSARIAL:
        found = extract([("user", shape)] * 10)
        assert len(found) <= DEFAULT_LIMIT
    assert time.monotonic() - started < 60


def test_only_the_scan_bound_is_read() -> None:
    """Facts past `SCAN_TOTAL` characters read are not read (the bound); the first parts'
    are. A huge part counts what is read of it, its head and tail."""
    filler = "lorem ipsum " * (SCAN_HEAD // 12 + 10)
    parts = [("user", "first ERR-1001 here")]
    parts += [("output", filler)] * (SCAN_TOTAL // SCAN_HEAD + 1)
    parts += [("user", "late ERR-9009 there")]
    found = texts(extract(parts))  # type: ignore[arg-type]
    assert "ERR-1001" in found and "ERR-9009" not in found


def test_a_labelled_identifier_comes_with_its_label_before_the_bare_ones() -> None:
    """``key=value`` whose value is an identifier says what it identifies: it ranks as an
    identifier, before the bare identifiers of its source, and the bare value inside it is not
    listed again; a number with a unit or a plain number stays a value."""
    text = (
        "worker 3f9a2c1e started\nbuild-2031 queued\nrequest_id=req_8f3a21 failed\n"
        "took=250ms timeout=30"
    )
    found = extract([("output", text)])
    assert texts(found)[:3] == ["request_id=req_8f3a21", "3f9a2c1e", "build-2031"]
    assert found[0].rank == IDENTIFIER
    assert "req_8f3a21" not in texts(found)
    by_text = {f.text: f.rank for f in found}
    assert by_text["took=250ms"] == VALUE and by_text["timeout=30"] == VALUE


def test_a_bound_spreads_over_the_parts_before_taking_a_seconds_fact() -> None:
    """Every part's best fact comes before any part's second: a bound spent breadth first
    names something of each message replaced, rather than the first output's ids alone."""
    dump = " ".join(f"build-{k}00" for k in range(1, 40))
    parts: list[tuple[str, str]] = [("output", dump)] + [
        ("output", f"ok, see job-{k}77 for details") for k in range(1, 6)
    ]
    found = texts(extract(parts, limit=6))  # type: ignore[arg-type]
    assert found == ["build-100", "job-177", "job-277", "job-377", "job-477", "job-577"]
    # Each part's best first (by rank: the identifier before the path), then each one's second.
    ranked = extract([("output", "build-100 build-200"), ("output", "src/a/b.py ERR-9")])
    assert texts(ranked) == ["build-100", "ERR-9", "build-200", "src/a/b.py"]


def test_a_label_that_repeats_in_a_part_is_a_column_not_a_name() -> None:
    """``id=`` on every line of a log identifies a row each; a label that stands once
    (``request_id=``) says what the output is about, and comes first."""
    log = "\n".join(f"12:00:0{k} INFO step done id=a{k}f3c9e2" for k in range(8))
    text = log[:60] + "\nrequest_id=req_8f3a21\n" + log[60:]
    found = extract([("output", text)])
    assert texts(found)[0] == "request_id=req_8f3a21"
    assert "id=a0f3c9e2" in texts(found)  # still listed, with the identifiers
    assert {f.rank for f in found if f.text.startswith("id=")} == {IDENTIFIER}


def test_an_earlier_index_line_is_read_back_whole_and_a_constraint_stays_one() -> None:
    """A summary's index line lists facts as they were found; at the next compression they
    are read back whole, with their rank: the user's constraint is a constraint again and
    comes first, the identifiers stay whole (read as prose, the constraint was only its
    identifiers, and a later summary lost it: the rules that vanish from one compaction to
    the next)."""
    summary = Msg.assistant(
        "The agent deployed the build and fixed the failing test.\n"
        "Not in this summary, reload offload 3 for: Never deploy to prod-eu-7 before the smoke "
        "test passes | req-8f3a21 | 250 ms\n"
        "<!-- CONTEXT_OFFLOAD: handle=3 -->",
        kind="history_summary",
    )
    later = Msg.tool("c9", "status: build-2032 ok, see /srv/logs/build-2032.txt")
    found = facts_of([summary, Msg.assistant(None, [ToolUseBlock("c9", "ci", "{}")]), later])
    by_text = {f.text: f.rank for f in found}
    assert texts(found)[0] == "Never deploy to prod-eu-7 before the smoke test passes"
    assert by_text["Never deploy to prod-eu-7 before the smoke test passes"] == CONSTRAINT
    assert by_text["req-8f3a21"] == IDENTIFIER and by_text["250 ms"] == VALUE
    assert "prod-eu-7" not in by_text  # inside the constraint: kept by whatever keeps it
    assert {"build-2032", "/srv/logs/build-2032.txt"} <= set(by_text)
    assert not [t for t in by_text if "Not in this summary" in t or "offload" in t.casefold()]


def test_an_originals_text_that_looks_like_an_index_line_is_read_as_text() -> None:
    """Only what a compression wrote holds an index line: a user who writes one is read like
    any user (a phrase without a constraint's words is no fact; its identifier is), while
    the same line in a summary lists both."""
    line = "Not in this summary, reload offload 3 for: Skip the cache | req-8f3a21"
    by_text = {f.text: f.rank for f in facts_of([Msg.user(line)])}
    assert "Skip the cache" not in by_text
    assert by_text["req-8f3a21"] == IDENTIFIER
    summary = Msg.assistant(line, kind="history_summary")
    assert texts(facts_of([summary])) == ["req-8f3a21", "Skip the cache"]


def test_a_listed_fact_stays_in_the_part_it_was_listed_in() -> None:
    """S5's summary of a large output stands inside the tool's result: what its index line
    lists is read back in that part, with the exchanges, taking that part's turns. So a fold
    names the best fact of each output before a second of the summarized one (read as prose
    of their own, the 29 ids an S5 line listed filled a fold's bound ahead of every other
    output's fact, and the share of facts in view fell)."""
    ids = " | ".join(f"handler_{k}" for k in range(20))
    summarized = Msg(
        "tool",
        (
            ToolResultBlock(
                "c1",
                "The file defines request handlers.\n"
                f"Not in this summary, reload offload 4 for: fact_id=F00001-aa | {ids}",
                "read",
            ),
        ),
        kind="large_summary",
    )
    found = texts(
        facts_of(
            [
                Msg.assistant(None, [ToolUseBlock("c1", "read", "{}")]),
                summarized,
                Msg.assistant(None, [ToolUseBlock("c2", "read", "{}")]),
                Msg.tool("c2", "ok fact_id=F00002-bb"),
                Msg.assistant(None, [ToolUseBlock("c3", "read", "{}")]),
                Msg.tool("c3", "ok fact_id=F00003-cc"),
            ],
            limit=4,
        )
    )
    assert found == ["fact_id=F00001-aa", "fact_id=F00002-bb", "fact_id=F00003-cc", "handler_0"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(
            st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=40
        ).filter(lambda t: t.strip() and " | " not in f" {t} " and "\n" not in t),
        max_size=8,
    )
)
def test_an_index_line_as_written_is_read_back_fact_for_fact(listed: list[str]) -> None:
    """The line the check writes and the line the extractor reads are one format (both in
    `autoctx._strategies.facts`): what it lists comes back, in order, and the summary's own
    text is left as it was."""
    text = "The agent ran the tests.\n" + index_line_text("offload 7", listed)
    kept, back = _split_index_lines(text)
    assert back == listed
    assert kept == "The agent ran the tests."
