"""The web console in real headless Chromium (Debian's package, driven by Playwright) against
the whole embedded platform (the ``platform`` and ``version`` fixtures of ``tests/conftest.py``,
which run the console too).

A pipeline (preprocess → train → evaluate → gated canary deploy) gives every section something real
to show. Then each role logs in and sees exactly the sections it may, and is refused what it may
not; an ML engineer submits a job from the YAML editor (an invalid spec first) and watches it
run; a dataset's lineage leads from its version to the job and the model; an auditor searches
the audit log, exports the result as CSV and verifies an event's inclusion proof. Every page is
checked for console errors, and screenshots of the main pages are saved under
``test-artifacts/console/`` (git-ignored) for review.
"""

from __future__ import annotations

import datetime as dt
import textwrap
import time
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, expect

from gantry.client.admin import create_token
from gantry.client.workflows import WorkflowsClient
from gantry.supervisor.platform import Platform
from gantry.testing.browser import ConsoleTab, chromium, console_tab
from gantry.testing.specs import churn_pipeline, small_training_job

# whole-platform tests: generous bounds (the suite runs two files side by side)
pytestmark = pytest.mark.timeout(300)

OWNER = "mira-ml"

#: The sections each role's navigation shows.
SECTIONS = {
    "platform-admin": {"cluster", "jobs", "data", "models", "workflows", "audit"},
    "ml-developer": {"cluster", "jobs", "data", "models", "workflows"},
    "data-steward": {"data"},
    "auditor": {"audit"},
}
ALL = ("cluster", "jobs", "data", "models", "workflows", "audit")


def _token(platform: Platform, who: str, roles: list[str]) -> str:
    return create_token(platform.data_dir, who, roles, dt.timedelta(hours=1))


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as running:
        yield running


@pytest.fixture(scope="module")
def story(platform: Platform, version: str) -> dict[str, str]:
    """Run the pipeline; what it made (run id, job ids, model, deployment)."""
    owner = _token(platform, OWNER, ["ml-developer", "data-steward"])
    with WorkflowsClient(platform.address("workflows"), owner) as wf:
        wf.submit(churn_pipeline("console-e2e", version))
        done = wf.wait(wf.start("console-e2e").run.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded", (done.state, done.reason)
    pre, train = done.step("preprocess"), done.step("train")
    return {
        "run": done.id,
        "train_job": train.job_id,
        "model": train.outputs["model"],
        "features": pre.outputs["version"],
        "version": version,
    }


def _nav(tab: ConsoleTab) -> set[str]:
    return {
        key for key in ALL if tab.page.locator(f'header nav a[data-section="{key}"]').count() == 1
    }


@pytest.mark.parametrize("role", sorted(SECTIONS))
def test_each_role_sees_only_its_sections_and_is_refused_the_rest(
    platform: Platform, browser: Browser, story: dict[str, str], role: str
) -> None:
    token = _token(platform, f"{role}-user", [role])
    with console_tab(browser, platform.console_url, role, token) as tab:
        tab.open("/me")
        assert tab.page.get_by_test_id("me-subject").inner_text() == f"{role}-user"
        assert _nav(tab) == SECTIONS[role]
        for key in SECTIONS[role]:
            tab.open(f"/{key}")
            expect(tab.page.locator("h1").first).to_be_visible()
            assert tab.page.get_by_test_id("error").count() == 0, (role, key)
            tab.shot(key)
        for key in set(ALL) - SECTIONS[role]:
            status = tab.status(f"/{key}")
            assert status == 403, (role, key, status)
            expect(tab.page.get_by_test_id("error")).to_contain_text("Refused")
        assert tab.errors == [], tab.errors


def test_a_bad_token_is_refused_at_the_login_form(platform: Platform, browser: Browser) -> None:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(f"{platform.console_url}/jobs")
        assert "/login" in page.url
        page.fill("#token", "eyJ.not.a-token")
        page.click("button[type=submit]")
        expect(page.locator("[role=alert]")).to_be_visible()
        assert "/login" in page.url
    finally:
        context.close()


SMALL_JOB = small_training_job("console-e2e-job")


def test_a_job_submitted_from_the_editor_runs_to_the_end(
    platform: Platform, browser: Browser, story: dict[str, str]
) -> None:
    token = _token(platform, "eli-ml", ["ml-developer"])
    with console_tab(browser, platform.console_url, "ml-developer", token) as tab:
        tab.open("/jobs/new")
        editor = tab.page.get_by_test_id("job-spec")
        # a spec with a mistake: the problems appear as one types, the text is kept
        editor.fill(SMALL_JOB.replace("replicas: 1", "replicas: -3"))
        editor.press("End")
        expect(tab.page.get_by_test_id("spec-problems")).to_be_visible(timeout=10_000)
        expect(tab.page.get_by_test_id("spec-problems")).to_contain_text("replicas")
        tab.shot("job-editor-problems")
        editor.fill(SMALL_JOB)
        editor.press("End")
        expect(tab.page.get_by_test_id("spec-valid")).to_be_visible(timeout=10_000)
        with tab.page.expect_navigation():
            tab.page.get_by_test_id("submit-job").click()
        assert "/jobs/" in tab.page.url
        # the page follows the job by itself (htmx) until it has finished
        expect(tab.page.get_by_test_id("job-state")).to_have_text("succeeded", timeout=120_000)
        expect(tab.page.get_by_test_id("log-lines")).to_be_visible()
        tab.shot("job")
        assert tab.errors == [], tab.errors


def test_an_auditor_searches_exports_and_verifies_an_event(
    platform: Platform, browser: Browser, story: dict[str, str]
) -> None:
    token = _token(platform, "ida-auditor", ["auditor"])
    with console_tab(browser, platform.console_url, "auditor", token) as tab:
        tab.open("/audit")
        tab.page.get_by_test_id("filter-type").fill("gantry.data.version.committed")
        with tab.page.expect_navigation():
            tab.page.get_by_test_id("search-submit").click()
        rows = tab.page.get_by_test_id("audit-records").locator("tr[data-index]")
        expect(rows.first).to_be_visible(timeout=10_000)
        assert rows.count() >= 2  # churn, and the pipeline's churn-features
        tab.shot("audit-search")
        # the same search as CSV
        with tab.page.expect_download() as download:
            tab.page.get_by_test_id("export-csv").click()
        text = download.value.path().read_text()
        header, *lines = [ln for ln in text.splitlines() if ln.strip()]
        assert "event_id" in header and len(lines) == rows.count(), (header, len(lines))
        assert all("gantry.data.version.committed" in ln for ln in lines)
        # one event's inclusion proof, checked in the console against the signed tree head
        index = rows.first.get_attribute("data-index")
        tab.open(f"/audit/integrity?index={index}")
        expect(tab.page.get_by_test_id("head-signature")).to_have_attribute("data-ok", "true")
        expect(tab.page.get_by_test_id("proof-result")).to_have_attribute("data-ok", "true")
        tab.page.get_by_test_id("verify-button").click()
        expect(tab.page.get_by_test_id("verify-result")).to_have_attribute(
            "data-ok", "true", timeout=30_000
        )
        tab.shot("audit-integrity")
        for path, name in (
            ("/audit/anomalies", "audit-anomalies"),
            ("/audit/reports", "audit-reports"),
        ):
            tab.open(path)
            tab.shot(name)
        assert tab.errors == [], tab.errors


def test_a_dataset_lineage_leads_to_the_job_and_the_model(
    platform: Platform, browser: Browser, story: dict[str, str]
) -> None:
    token = _token(platform, "eli-ml", ["ml-developer"])
    model_name = story["model"].partition(":")[0]
    with console_tab(browser, platform.console_url, "ml-developer", token) as tab:
        tab.open(f"/data/churn-features/lineage?version={story['features']}")
        graph = tab.page.get_by_test_id("lineage")
        expect(graph).to_be_visible()
        expect(graph.locator(f'[data-node="job:{story["train_job"]}"]')).to_have_count(1)
        model_node = f'[data-node="model_version:{story["model"]}"]'
        expect(graph.locator(model_node)).to_have_count(1)
        tab.shot("data-lineage")
        # the model's node leads to its page
        with tab.page.expect_navigation():
            graph.locator(f"a:has({model_node})").first.click()
        assert f"/models/{model_name}" in tab.page.url
        tab.shot("model")
        tab.open("/models/deployments/console-e2e")
        expect(tab.page.get_by_test_id("traffic")).to_be_visible()
        tab.shot("deployment")
        assert tab.errors == [], tab.errors


@pytest.mark.parametrize(
    ("role", "view", "sees_raw"),
    [("ml-developer", "deidentified", False), ("data-steward", "raw", True)],
)
def test_a_preview_shows_only_the_view_the_role_may_read(
    platform: Platform,
    browser: Browser,
    story: dict[str, str],
    role: str,
    view: str,
    sees_raw: bool,
) -> None:
    token = _token(platform, f"{role}-viewer", [role])
    with console_tab(browser, platform.console_url, role, token) as tab:
        tab.open(f"/data/churn/preview?version={story['version']}&rows=20")
        preview = tab.page.get_by_test_id("preview")
        expect(preview).to_have_attribute("data-view", view)
        table = tab.page.get_by_test_id("preview-rows")
        expect(table.locator("tr[data-row]")).to_have_count(20)
        text = table.inner_text().lower()
        assert ("@" in text) is sees_raw  # e-mail addresses: hashed in the de-identified view
        assert ("income" in text) is sees_raw  # a sensitive column: dropped
        if not sees_raw:  # and forcing the raw view is refused
            assert tab.status(f"/data/churn/preview?version={story['version']}&view=raw") == 403
        tab.shot(f"preview-{view}")
        assert tab.errors == [], tab.errors


SEARCH = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: Experiment
    metadata: {{name: console-e2e-search}}
    spec:
      objective: {{metric: accuracy, goal: maximize}}
      method: random
      seed: 3
      budget: {{trials: 2}}
      parallelism: 2
      space:
        lr: {{logUniform: [0.001, 0.1]}}
      trial:
        resources: {{cpus: 0.5, memory: 1Gi}}
        entrypoint:
          task: gantry.training.examples.tabular:task
          args: ["lr=${{trial.lr}}", "epochs=1"]
        data: [{{dataset: churn, version: "{version}"}}]
    """
)
SESSION = textwrap.dedent(
    """
    apiVersion: gantry/v1
    kind: DevSession
    metadata: {name: console-scratch}
    spec:
      interface: shell
      resources: {cpus: 0.25, memory: 512Mi}
      idleTimeout: 10m
      lifetime: 30m
    """
)


def test_workflows_show_the_run_graph_the_search_and_a_session_to_stop(
    platform: Platform, browser: Browser, story: dict[str, str]
) -> None:
    token = _token(platform, OWNER, ["ml-developer", "data-steward"])
    with WorkflowsClient(platform.address("workflows"), token) as wf:
        wf.submit_experiment(SEARCH.format(version=story["version"]))
        wf.start_session(SESSION)
        with console_tab(browser, platform.console_url, "ml-developer", token) as tab:
            # the pipeline's run drawn as a graph, every step done
            tab.open(f"/workflows/runs/{story['run']}")
            graph = tab.page.get_by_test_id("run-graph")
            for step in ("preprocess", "train", "evaluate", "deploy"):
                node = graph.locator(f'[data-node="{step}"]')
                expect(node).to_have_attribute("data-state", "succeeded")
            tab.shot("workflow-run")
            tab.open("/workflows/pipelines/console-e2e")
            expect(tab.page.get_by_test_id("pipeline-graph")).to_be_visible()
            # the search: the objective over its trials
            done = wf.wait_experiment("console-e2e-search", timeout_s=240, poll_s=0.5)
            assert done.state == "succeeded", (done.state, done.reason)
            tab.open("/workflows/experiments/console-e2e-search")
            expect(tab.page.get_by_test_id("objective-chart").locator("svg")).to_be_visible()
            expect(tab.page.get_by_test_id("trials").locator("tr[data-trial]")).to_have_count(2)
            expect(tab.page.locator('tr[data-best="true"]')).to_have_count(1)
            tab.shot("experiment")
            # the session with its idle timer, stopped from the console
            wf.wait_session("console-scratch", timeout_s=120, poll_s=0.5)
            tab.open("/workflows?tab=sessions")
            expect(tab.page.locator('tr[data-session="console-scratch"]')).to_be_visible()
            tab.open("/workflows/sessions/console-scratch")
            expect(tab.page.get_by_test_id("idle-timeout")).to_contain_text("10m")
            tab.shot("session")
            with tab.page.expect_navigation():
                tab.page.get_by_test_id("session-stop").locator("button").click()
            expect(tab.page.get_by_test_id("session-state")).not_to_have_text("running")
            assert tab.errors == [], tab.errors
        stopped = wf.wait_session("console-scratch", states=("stopped",), timeout_s=60)
        assert stopped.state == "stopped"


def test_a_revoked_token_ends_the_console_login(
    platform: Platform, browser: Browser, story: dict[str, str]
) -> None:
    from gantry.client.audit import AuditClient

    token = _token(platform, "rex-revoked", ["ml-developer"])
    admin = _token(platform, "ops-admin", ["platform-admin"])
    with console_tab(browser, platform.console_url, "revoked", token) as tab:
        tab.open("/jobs")
        expect(tab.page.get_by_test_id("jobs")).to_be_visible()
        with AuditClient(platform.address("audit"), admin) as audit:
            audit.revoke_token(token=token, reason="laptop stolen")
        deadline = time.monotonic() + 15  # every service learns it from the bus
        while "/login" not in tab.page.url:
            assert time.monotonic() < deadline, "the console kept serving a revoked token"
            time.sleep(0.5)
            tab.open("/jobs")
        expect(tab.page.locator("[role=alert]")).to_contain_text("revoked: laptop stolen")
        tab.open("/jobs")  # the cookie is gone: the login form again
        assert "/login" in tab.page.url
        assert tab.errors == [], tab.errors
