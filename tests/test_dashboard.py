"""The live page of ``resgroups serve`` (issue 16): ``/api/state`` and its history,
the login, and the page itself driven in headless Chromium (Debian's, through
Playwright's Python package; never a downloaded browser)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import psycopg.errors
import pytest
from servers import ServerProcess, serving, start_server
from waiting import wait_until

from resgroups.sched.stats import GroupStatistics
from resgroups.server.dashboard import SERIES, STATIC, History

CHROMIUM = os.environ.get("RESGROUPS_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("RESGROUPS_TEST_ARTIFACTS", Path(__file__).parent / "artifacts"))
ADMIN_PASSWORD = "page-admin"
LONG = "SELECT sum(x * x) FROM long_sequence(100000000000)"  # runs until cancelled


def fetch(url: str, user: str | None = None, password: str = "") -> tuple[int, Any, dict[str, str]]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            body = reply.read()
            headers = dict(reply.headers)
            status = reply.status
    except urllib.error.HTTPError as error:
        with error:
            body, headers, status = error.read(), dict(error.headers), error.code
    if "json" in headers.get("Content-Type", ""):
        return status, json.loads(body), headers
    return status, body, headers


class Workload:
    """Long queries over the wire protocol, each on its own connection and thread,
    cancelled (and joined) when the block ends."""

    def __init__(self, srv: ServerProcess, user: str = "admin", password: str | None = None):
        self.srv, self.user, self.password = srv, user, password
        self.conns: list[psycopg.Connection[Any]] = []
        self.threads: list[threading.Thread] = []
        self.unexpected: list[BaseException] = []

    def start(self, group: str, sql: str = LONG) -> None:
        conn = psycopg.connect(self.srv.dsn(self.user, self.password), autocommit=True)
        conn.execute(f"SET RESOURCE GROUP {group}")
        self.conns.append(conn)

        def run() -> None:
            try:
                conn.execute(sql)
            except psycopg.errors.QueryCanceled:
                pass  # how every query of the workload ends
            except BaseException as exc:
                self.unexpected.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop(self) -> None:
        for conn in self.conns:
            conn.cancel_safe(timeout=10)
        for thread in self.threads:
            thread.join(30)
        for conn in self.conns:
            conn.close()
        assert not any(t.is_alive() for t in self.threads)
        assert not self.unexpected, self.unexpected


@contextlib.contextmanager
def workload(srv: ServerProcess, **login: Any) -> Iterator[Workload]:
    w = Workload(srv, **login)
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module", autouse=True)
def crowded() -> Iterator[ServerProcess]:
    """The server of test_the_page_stays_readable_at_13_groups_and_at_100, started
    with the module: that test's check of the 30 s window needs more than 31 s of
    history (a sample a second), which then builds up while the module's other
    tests run instead of after them. No other test touches it."""
    with serving(["--workers", "2"]) as srv:
        yield srv


# ---- the history ring buffer -------------------------------------------------------


def _stats(name: str, active: int) -> GroupStatistics:
    values: dict[str, Any] = {f: 0 for f in GroupStatistics.__dataclass_fields__}
    values.update(name=name, active_queries=active, scheduling_policy="fifo", base_group=None)
    return GroupStatistics(**values)


def test_history_keeps_the_last_samples_aligned_with_nulls_for_absent_groups() -> None:
    history = History(capacity=300)
    for second in range(310):
        stats = [_stats("DEFAULT", second)]
        if second >= 305:
            stats.append(_stats("late", 7))
        history.record(1000.0 + second, stats)
    series = history.series()
    assert len(history) == 300  # five minutes at one sample a second
    assert series["t"] == [1000.0 + s for s in range(10, 310)]
    assert list(series["groups"]) == ["DEFAULT", "late"]
    assert set(series["groups"]["DEFAULT"]) == set(SERIES)
    assert series["groups"]["DEFAULT"]["active_queries"] == [float(s) for s in range(10, 310)]
    assert series["groups"]["late"]["active_queries"] == [None] * 295 + [7.0] * 5


# ---- /api/state ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with serving(["--workers", "2"]) as srv:
        with psycopg.connect(srv.dsn(), autocommit=True) as admin:
            admin.execute("CREATE RESOURCE GROUP reports WITH (max_active_queries = 1)")
            admin.execute("CREATE RESOURCE GROUP dash WITH (cpu_weight = 400)")
        yield srv


def _history(srv: ServerProcess) -> dict[str, Any]:
    history: dict[str, Any] = fetch(f"{srv.url}/api/state")[1]["history"]
    return history


def test_api_state_has_groups_history_and_queries(server: ServerProcess) -> None:
    # sampled once a second: wait for two samples that know the groups
    def samples_of_dash() -> int:
        active = _history(server)["groups"].get("dash", {}).get("active_queries", [])
        return sum(v is not None for v in active)

    wait_until(lambda: samples_of_dash() >= 2, timeout=30)
    status, state, headers = fetch(f"{server.url}/api/state")
    assert status == 200
    assert headers["Cache-Control"] == "no-store"
    assert set(state) == {
        "now", "interval", "cpus", "user", "notice", "groups", "history", "queries"
    }  # fmt: skip
    assert state["cpus"] > 0
    assert [g["name"] for g in state["groups"]] == ["DEFAULT", "reports", "dash"]
    t = state["history"]["t"]
    assert t == sorted(t)
    assert state["now"] - t[-1] < 5
    assert set(state["history"]["groups"]["reports"]) == set(SERIES)
    with workload(server) as w:
        for _ in range(3):
            w.start("reports")
        wait_until(lambda: len(fetch(f"{server.url}/api/state")[1]["queries"]) == 3, timeout=30)
        queries = fetch(f"{server.url}/api/state")[1]["queries"]
        assert sorted(q["state"] for q in queries).count("queued") == 2
        assert {q["resource_group"] for q in queries} == {"reports"}
        # the sampler saw them too
        wait_until(
            lambda: (
                fetch(f"{server.url}/api/state")[1]["history"]["groups"]["reports"][
                    "queued_queries"
                ][-1]
                == 2
            ),
            timeout=30,
        )


def test_serve_says_where_the_live_page_is(server: ServerProcess) -> None:
    """The line after the listeners' (README's "Serving clients" shows both)."""
    line: list[str] = []
    reader = threading.Thread(
        target=lambda: line.append(server.proc.stdout.readline()),  # type: ignore[union-attr]
        daemon=True,
    )
    reader.start()
    reader.join(30)
    assert line == [f"the live page: {server.url}/\n"]


def test_the_page_and_its_files_are_served_and_nothing_else(server: ServerProcess) -> None:
    status, body, headers = fetch(f"{server.url}/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b"/static/uPlot.iife.min.js" in body
    for name, kind in STATIC.items():
        status, _, headers = fetch(f"{server.url}/static/{name}")
        assert status == 200, name
        assert headers["Content-Type"].startswith(kind), name
    status, _, headers = fetch(f"{server.url}/favicon.ico")
    assert status == 200
    assert headers["Content-Type"] == "image/svg+xml"
    for bad in ("../__init__.py", "dashboard.py", "%2e%2e%2fapp.py"):
        assert fetch(f"{server.url}/static/{bad}")[0] == 404
    licence = fetch(f"{server.url}/static/uPlot.LICENSE")[1]
    assert b"MIT License" in licence
    assert b"Leon Sorokin" in licence


# ---- with access control on --------------------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerProcess]:
    srv = start_server(
        ["--access-control", "--workers", "2"], env={"RESGROUPS_ADMIN_PASSWORD": ADMIN_PASSWORD}
    )
    try:
        with psycopg.connect(srv.dsn("admin", ADMIN_PASSWORD), autocommit=True) as admin:
            admin.execute("CREATE RESOURCE GROUP reports WITH (max_active_queries = 1)")
            for user in ("ann", "bob"):
                admin.execute(f"CREATE USER {user} WITH PASSWORD '{user}-pw'")
                admin.execute(f"GRANT USE ON RESOURCE GROUP reports TO {user}")
        yield srv
    finally:
        assert srv.stop() == 0


def test_the_page_needs_the_login_of_execute(guarded: ServerProcess) -> None:
    for path in ("/", "/api/state"):
        status, body, headers = fetch(f"{guarded.url}{path}")
        assert status == 401
        assert headers["WWW-Authenticate"] == 'Basic realm="resgroups"'
        assert body["error"]["sqlstate"] == "28P01"  # as /execute answers
        assert fetch(f"{guarded.url}{path}", "admin", "wrong")[0] == 401
        assert fetch(f"{guarded.url}{path}", "admin", ADMIN_PASSWORD)[0] == 200
        assert fetch(f"{guarded.url}{path}", "ann", "ann-pw")[0] == 200


def test_the_state_shows_only_what_the_principal_may_read(guarded: ServerProcess) -> None:
    with workload(guarded, user="bob", password="bob-pw") as w:
        w.start("reports")
        admin_view = lambda: fetch(f"{guarded.url}/api/state", "admin", ADMIN_PASSWORD)[1]  # noqa: E731
        wait_until(lambda: len(admin_view()["queries"]) == 1, timeout=30)
        assert admin_view()["queries"][0]["user_name"] == "bob"
        assert admin_view()["history"] is not None
        ann = fetch(f"{guarded.url}/api/state", "ann", "ann-pw")[1]
        assert ann["user"] == "ann"
        assert ann["groups"] is None
        assert ann["history"] is None
        assert "RESOURCE GROUP ADMIN" in ann["notice"]
        assert ann["queries"] == []  # bob's query is not hers
        bob = fetch(f"{guarded.url}/api/state", "bob", "bob-pw")[1]
        assert [q["user_name"] for q in bob["queries"]] == ["bob"]


# ---- in a real browser --------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _watch(page: Any, origin: str) -> tuple[list[str], list[str]]:
    """Console errors and page errors, and requests that left ``origin``."""
    problems: list[str] = []
    foreign: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(origin) else foreign.append(r.url))
    return problems, foreign


def _page_reading(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """() => ({
            updates: window.dashboard.updates,
            now: window.dashboard.state && window.dashboard.state.now,
            chartT: window.dashboard.charts.cpuUsed ? window.dashboard.charts.cpuUsed.data[0] : [],
            queries: [...document.querySelectorAll('#queries tbody tr')].map(
                (tr) => [...tr.cells].map((c) => c.textContent)),
            groups: [...document.querySelectorAll('#groups tbody tr')].map(
                (tr) => [...tr.cells].map((c) => c.textContent)),
        })"""
    )


def _not_blank(png: bytes) -> None:
    from io import BytesIO

    import matplotlib.image

    pixels = matplotlib.image.imread(BytesIO(png), format="png")
    assert pixels.shape[0] > 400
    assert pixels.shape[1] > 800
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]).round(2), axis=0)
    assert len(colours) > 20, f"the screenshot has {len(colours)} colours: blank"
    assert pixels.std() > 0.05


def test_the_page_updates_live_in_chromium(server: ServerProcess, browser: Any) -> None:
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    problems, foreign = _watch(page, server.url)
    assert page.goto(f"{server.url}/").status == 200
    with workload(server) as w:
        w.start("dash")
        for _ in range(3):
            w.start("reports")

        # the table shows what /api/state shows: the same queries, states and groups
        def same_queries() -> bool:
            shown = {(r[0], r[1], r[2], r[5]) for r in _page_reading(page)["queries"]}
            api = fetch(f"{server.url}/api/state")[1]["queries"]
            return shown == {
                (str(q["query_id"]), q["statement"], q["state"], q["resource_group"]) for q in api
            } and (len(shown) == 4)

        wait_until(same_queries, timeout=30)
        first = _page_reading(page)
        wait_until(lambda: _page_reading(page)["updates"] >= first["updates"] + 2, timeout=30)
        second = _page_reading(page)
        # the charts moved on, along the server's history
        assert second["now"] > first["now"]
        assert second["chartT"][-1] > first["chartT"][-1]
        api = fetch(f"{server.url}/api/state")[1]
        assert set(second["chartT"]) <= set(api["history"]["t"]) | set(first["chartT"])
        # the groups table: reports has one running and two queued, as the API says
        reports = next(r for r in second["groups"] if r[0] == "reports")
        api_reports = next(g for g in api["groups"] if g["name"] == "reports")
        assert reports[1:3] == [
            str(api_reports["active_queries"]),
            str(api_reports["queued_queries"]),
        ]
        assert reports[1:3] == ["1", "2"]
        # the waits shown grow between two reads
        waited = {r[0]: r for r in first["queries"]}
        assert any(r[4] != waited[r[0]][4] for r in second["queries"] if r[0] in waited)
        # the statement, not only its id
        assert {r[1] for r in second["queries"]} == {
            "SELECT sum((x * x)) FROM long_sequence(100000000000)"  # as the engine prints it
        }
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        png = page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    _not_blank(png)
    page.close()
    assert problems == [], problems
    assert foreign == [], foreign  # no CDN: every request went to resgroups


def test_the_page_in_chromium_with_access_control(guarded: ServerProcess, browser: Any) -> None:
    from playwright.sync_api import Error as BrowserError

    for credentials in (None, {"username": "admin", "password": "wrong"}):
        refused = browser.new_context(http_credentials=credentials)
        assert refused.request.get(f"{guarded.url}/").status == 401
        assert refused.request.get(f"{guarded.url}/api/state").status == 401
        # headless, the browser cannot ask for a login: it shows the refusal, or
        # refuses to navigate at all
        failure: list[str] = []
        try:
            response = refused.new_page().goto(f"{guarded.url}/")
        except BrowserError as exc:
            failure.append(str(exc))
        if failure:
            assert "ERR_INVALID_AUTH_CREDENTIALS" in failure[0]
        else:
            assert response is not None
            assert response.status == 401
        refused.close()
    context = browser.new_context(
        http_credentials={"username": "admin", "password": ADMIN_PASSWORD}
    )
    page = context.new_page()
    problems, foreign = _watch(page, guarded.url)
    assert page.goto(f"{guarded.url}/").status == 200
    wait_until(lambda: _page_reading(page)["updates"] >= 1, timeout=30)
    assert page.locator("#user").text_content() == "as admin"
    assert page.locator("#charts").is_visible()
    context.close()
    ann = browser.new_context(http_credentials={"username": "ann", "password": "ann-pw"})
    page = ann.new_page()
    assert page.goto(f"{guarded.url}/").status == 200
    wait_until(lambda: _page_reading(page)["updates"] >= 1, timeout=30)
    assert not page.locator("#charts").is_visible()  # the groups are the admins'
    assert "RESOURCE GROUP ADMIN" in (page.locator("#notice").text_content() or "")
    ann.close()
    assert problems == []
    assert foreign == []


# ---- readable at 13 groups and at 100 ------------------------------------------------


def _layout(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """() => ({
            legend: document.querySelector('#legend').getBoundingClientRect().height,
            charts: [...document.querySelectorAll('.chart')].map(
                (c) => c.getBoundingClientRect().height),
            uplotLegends: [...document.querySelectorAll('.u-legend')].filter(
                (l) => l.offsetParent !== null).length,
            groupsTop: document.querySelector('#groups').getBoundingClientRect().top,
            colours: Object.assign({}, window.dashboard.colours),
            rows: document.querySelectorAll('#groups tbody tr').length,
            cpu: window.dashboard.cpuSeries,
            points: window.dashboard.charts.cpuUsed
                ? window.dashboard.charts.cpuUsed.data[0].length : 0,
        })"""
    )


def test_the_page_stays_readable_at_13_groups_and_at_100(
    crowded: ServerProcess, browser: Any
) -> None:
    """One compact legend instead of one per chart that lists every series; the
    charts keep their height; every group its own colour; the tables in view;
    the statement in the queries table; the window the user chooses."""
    srv = crowded
    with psycopg.connect(srv.dsn(), autocommit=True) as admin:
        for i in range(1, 12):
            admin.execute(f"CREATE RESOURCE GROUP g{i:02d} WITH (cpu_weight = {i * 10})")
        admin.execute("CREATE RESOURCE GROUP capped WITH (cpu_limit = '25%')")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems, _ = _watch(page, srv.url)
    assert page.goto(f"{srv.url}/").status == 200
    with workload(srv) as w:
        w.start("capped")
        w.start("g05")
        w.start("g05", "SELECT count(*) FROM long_sequence(100000000000) WHERE x % 7 = 3")
        wait_until(lambda: _layout(page)["rows"] == 13, timeout=30)
        wait_until(lambda: (_layout(page)["cpu"] or {}).get("capped", [0])[-1] > 0, timeout=30)
        wait_until(lambda: len(_page_reading(page)["queries"]) == 3, timeout=30)
        at13 = _layout(page)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        png = page.screenshot(path=str(ARTIFACTS / "dashboard-13-groups.png"), full_page=True)
        statements = {r[1] for r in _page_reading(page)["queries"]}
        assert any("WHERE" in text and "long_sequence" in text for text in statements)
        # the capped group never draws above its limit for long: 25 % of the CPUs
        capped = [v for v in _layout(page)["cpu"]["capped"] if v > 0]
        assert sorted(capped)[len(capped) // 2] <= 25 * 1.3, capped
    _not_blank(png)
    assert len(at13["colours"]) == 13
    assert len(set(at13["colours"].values())) == 13
    assert at13["uplotLegends"] == 0
    assert at13["legend"] <= 60, at13
    assert max(at13["charts"]) <= 240, at13
    assert at13["groupsTop"] < 1000, "the groups table is below the fold"
    with psycopg.connect(srv.dsn(), autocommit=True) as admin:
        for i in range(12, 99):
            admin.execute(f"CREATE RESOURCE GROUP g{i:02d}")
    wait_until(lambda: _layout(page)["rows"] == 100, timeout=30)
    wait_until(lambda: len(_layout(page)["colours"]) == 100, timeout=30)
    at100 = _layout(page)
    # the first 13 kept their colours; all 100 are distinct
    assert {k: at100["colours"][k] for k in at13["colours"]} == at13["colours"]
    assert len(set(at100["colours"].values())) == 100
    assert at100["legend"] <= 60, at100
    assert max(at100["charts"]) <= 240, at100
    assert at100["groupsTop"] < 1000
    png = page.screenshot(path=str(ARTIFACTS / "dashboard-100-groups.png"), full_page=False)
    _not_blank(png)
    # the window: the last 30 s instead of five minutes
    wait_until(lambda: _layout(page)["points"] > 31, timeout=60)
    page.select_option("#window", "30")
    wait_until(lambda: _layout(page)["points"] <= 31, timeout=10)
    page.close()
    assert problems == [], problems


def test_children_are_drawn_under_their_parent(server: ServerProcess, browser: Any) -> None:
    """resource_groups()' parent_group (nested groups): each child under its parent,
    depth first; without the column every group is at the top, in creation order."""
    page = browser.new_page()
    assert page.goto(f"{server.url}/").status == 200
    wait_until(lambda: _page_reading(page)["updates"] >= 1, timeout=30)
    flat = page.evaluate(
        "() => window.dashboard.groupTree([{name: 'DEFAULT'}, {name: 'a'}, {name: 'b'}])"
        ".map((n) => [n.name, n.depth])"
    )
    assert flat == [["DEFAULT", 0], ["a", 0], ["b", 0]]
    nested = page.evaluate(
        """() => window.dashboard.groupTree([
            {name: 'DEFAULT', parent_group: null}, {name: 'nightly', parent_group: 'etl'},
            {name: 'etl', parent_group: null}, {name: 'deep', parent_group: 'nightly'},
            {name: 'adhoc', parent_group: null}, {name: 'backfill', parent_group: 'etl'},
            {name: 'orphan', parent_group: 'gone'},
        ]).map((n) => [n.name, n.depth])"""
    )
    assert nested == [
        ["DEFAULT", 0], ["etl", 0], ["nightly", 1], ["deep", 2], ["backfill", 1],
        ["adhoc", 0], ["orphan", 0],
    ]  # fmt: skip
    page.close()
