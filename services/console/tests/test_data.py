"""The Data section: datasets, versions, view policies, diffs, lineage, and row previews in
the view the role allows (never raw rows for a role limited to de-identified data)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from gantry.client.admin import create_token
from gantry.client.errors import RemotePermissionDenied
from gantry.client.governance import (
    ColumnRule,
    ColumnSpec,
    Dataset,
    Diff,
    LineageEdge,
    Shard,
    Version,
    ViewPolicy,
)
from gantry.console.app import build_app
from gantry.console.pages.data import choose_view, human_bytes
from gantry.console.settings import ConsoleOptions, ConsoleSettings
from gantry.console.viewer import Viewer
from gantry.core import PermissionDenied
from gantry.security import Authorizer, default_policy
from gantry.testing.console import ORIGIN, Closing, FakeApis

Console = tuple[TestClient, FakeApis, Callable[..., str]]

V1 = "a" * 64
V2 = "b" * 64
COLUMNS = (
    ColumnSpec("customer_id", "int64", "internal", nullable=False),
    ColumnSpec("email", "string", "pii"),
    ColumnSpec("income", "float64", "sensitive"),
)
SHARDS = (Shard("s1" + "0" * 62, 3, 300), Shard("s2" + "0" * 62, 2, 200))


def _dataset(name: str = "churn", fmt: str = "table", head: str = V2) -> Dataset:
    return Dataset(
        name=name,
        owner="sam-steward",
        format=fmt,
        columns=COLUMNS if fmt == "table" else (ColumnSpec("content", "binary", "internal"),),
        description="CRM churn table",
        head=head,
        created_ms=1_700_000_000_000,
        versions=2 if head else 0,
        policy_version=1,
    )


def _version(vid: str, message: str, rows: int = 5, shards: Sequence[Shard] = SHARDS) -> Version:
    return Version(
        id=vid,
        dataset="churn",
        parents=(),
        message=message,
        author="sam-steward",
        created_ms=1_700_000_100_000,
        rows=rows,
        bytes=81_000,
        shards=tuple(shards),
        columns=COLUMNS,
    )


RAW = pa.table(
    {
        "customer_id": [1, 2, 3],
        "email": ["ann@example.com", "bob@example.com", "cy@example.com"],
        "income": [10.0, 20.0, 30.0],
    }
)
DEID = pa.table({"customer_id": [1, 2, 3], "email": ["h1", "h2", "h3"]})


class _Gov:
    """Governance stand-in: records every read with its view and shards."""

    def __init__(self, *, fmt: str = "table", refuse: bool = False) -> None:
        self.fmt = fmt
        self.refuse = refuse
        self.reads: list[dict[str, Any]] = []
        self.diffs: list[tuple[str, str, str]] = []

    def _check(self) -> None:
        if self.refuse:
            raise RemotePermissionDenied("'aud' may not list dataset (the stand-in refuses)")

    def list_datasets(self) -> list[Dataset]:
        self._check()
        return [_dataset("customers"), _dataset("churn"), _dataset("empty", head="")]

    def get_dataset(self, name: str) -> Dataset:
        self._check()
        return _dataset(name, self.fmt, head="" if name == "empty" else V2)

    def log(self, dataset: str, limit: int = 0) -> list[Version]:
        return [_version(V2, "second load"), _version(V1, "first load")]

    def get_version(self, dataset: str, version: str = "") -> Version:
        if self.fmt == "files":
            files = (Shard("f1", 1, 10, "a/one.txt"), Shard("f2", 1, 10, "b/two.txt"))
            return _version(V2, "files", rows=2, shards=files)
        return _version(V1 if version.startswith("a") else V2, "load", rows=5)

    def get_view_policy(self, dataset: str) -> ViewPolicy:
        return ViewPolicy(
            dataset,
            1,
            (
                ColumnRule("hash", classification="pii"),
                ColumnRule("generalize", column="dob", params={"date": "year"}),
            ),
            "sam-steward",
            1_700_000_000_000,
        )

    def lineage(self, **kw: Any) -> list[LineageEdge]:
        return [
            LineageEdge("dataset_version", f"churn@{V2}", "job", "j-1", 1),
            LineageEdge("job", "j-1", "model_version", "churn-classifier:2", 2),
            LineageEdge("job", "j-1", "dataset_version", f"churn-features@{V1}", 3),
        ]

    def diff(self, dataset: str, a: str, b: str) -> Diff:
        self.diffs.append((dataset, a, b))
        return Diff(a, b, (SHARDS[1],), (SHARDS[0],), 2, 3, ("added column 'tenure' (int64)",))

    def read_batches(
        self,
        dataset: str,
        version: str = "",
        view: str = "deidentified",
        shards: Sequence[str] = (),
        purpose: str = "",
        grant: str = "",
    ) -> Iterator[tuple[str, pa.Table]]:
        self.reads.append({"view": view, "shards": list(shards), "purpose": purpose})
        table = RAW if view == "raw" else DEID
        yield shards[0], table
        raise AssertionError("the preview must stop after the first shard")


def _use(apis: FakeApis, gov: _Gov) -> _Gov:
    apis.factories["governance"] = lambda viewer: Closing(gov)
    return gov


def test_the_list_shows_datasets_with_lazy_sizes(console: Console) -> None:
    client, apis, login = console
    _use(apis, _Gov())
    login("dev", "ml-developer")
    page = client.get("/data")
    assert page.status_code == 200
    assert 'data-testid="datasets"' in page.text
    assert page.text.index('data-dataset="churn"') < page.text.index('data-dataset="customers"')
    assert 'hx-get="/data/churn/size"' in page.text
    assert 'data-dataset="empty"' in page.text and "none yet" in page.text
    size = client.get("/data/churn/size", headers={"hx-request": "true"})
    assert size.status_code == 200 and "<html" not in size.text
    assert 'data-rows="5"' in size.text and "79.1 KiB" in size.text


def test_a_page_number_below_one_is_a_clear_400(console: Console) -> None:
    client, apis, login = console
    _use(apis, _Gov())
    login("dev", "ml-developer")
    reply = client.get("/data?p=0")
    assert reply.status_code == 400 and "pages start at 1" in reply.text


def test_the_dataset_page_shows_columns_versions_policy_and_lineage(console: Console) -> None:
    client, apis, login = console
    _use(apis, _Gov())
    login("dev", "ml-developer")
    page = client.get("/data/churn")
    assert page.status_code == 200
    text = page.text
    assert 'data-column="email"' in text and ">pii<" in text
    assert f'data-version="{V2}"' in text and f'data-version="{V1}"' in text
    assert 'data-testid="view-policy"' in text and 'data-rule="class:pii"' in text
    assert "date=year" in text
    assert 'data-testid="diff-form"' in text and 'hx-get="/data/churn/diff"' in text
    # lineage: dataset version -> job -> model version and a downstream dataset version
    assert 'data-node="job:j-1"' in text and 'href="/jobs/j-1"' in text
    assert 'href="/models/churn-classifier?version=2"' in text
    assert f'href="/data/churn-features/lineage?version={V1}"' in text
    assert 'data-testid="readable-views">deidentified view' in text
    assert "read in the deidentified view" in text


def test_the_preview_of_a_deidentified_only_role_never_reads_raw(console: Console) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov())
    login("dev", "ml-developer")
    page = client.get("/data/churn/preview?rows=2")
    assert page.status_code == 200
    assert gov.reads == [
        {"view": "deidentified", "shards": [SHARDS[0].id], "purpose": "console preview"}
    ]
    assert 'data-view="deidentified"' in page.text and "ann@example.com" not in page.text
    assert 'data-row="1"' in page.text and 'data-row="2"' not in page.text  # 2 rows asked
    assert "show the raw view" not in page.text  # not offered
    forced = client.get("/data/churn/preview?rows=2&view=raw")
    assert forced.status_code == 403 and "Refused" in forced.text
    assert len(gov.reads) == 1  # refused before any read


def test_the_preview_of_a_steward_reads_raw_and_offers_the_deidentified_view(
    console: Console,
) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov())
    login("sam", "data-steward")
    page = client.get("/data/churn/preview", headers={"hx-request": "true"})
    assert page.status_code == 200 and "<html" not in page.text
    assert gov.reads[-1]["view"] == "raw" and "ann@example.com" in page.text
    assert 'data-testid="preview-switch"' in page.text and "view=deidentified" in page.text
    again = client.get("/data/churn/preview?view=deidentified")
    assert gov.reads[-1]["view"] == "deidentified" and "ann@example.com" not in again.text


@pytest.mark.parametrize(
    ("query", "message"),
    [("rows=0", "cannot preview 0 rows"), ("rows=500", "ask for 1 to 200 rows"),
     ("view=secret", "unknown view")],
)  # fmt: skip
def test_bad_preview_input_is_a_400(console: Console, query: str, message: str) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov())
    login("sam", "data-steward")
    reply = client.get(f"/data/churn/preview?{query}")
    assert reply.status_code == 400 and message in reply.text
    assert gov.reads == []


def test_a_files_dataset_previews_file_names_only(console: Console) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov(fmt="files"))
    login("sam", "data-steward")
    page = client.get("/data/docs/preview")
    assert page.status_code == 200
    assert "a/one.txt" in page.text and 'data-testid="preview-files"' in page.text
    assert gov.reads == []


def test_the_diff_renders_counts_and_schema_changes_as_page_or_fragment(
    console: Console,
) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov())
    login("dev", "ml-developer")
    page = client.get(f"/data/churn/diff?a={V1}&b={V2}")
    assert page.status_code == 200 and "<html" in page.text
    assert gov.diffs == [("churn", V1, V2)]
    assert 'data-testid="rows-added">2<' in page.text
    assert 'data-testid="rows-removed">3<' in page.text
    assert "added column &#39;tenure&#39; (int64)" in page.text
    assert 'data-change="added"' in page.text and 'data-change="removed"' in page.text
    fragment = client.get(f"/data/churn/diff?a={V1}&b={V2}", headers={"hx-request": "true"})
    assert fragment.status_code == 200 and "<html" not in fragment.text
    assert 'data-testid="diff"' in fragment.text


def test_a_diff_without_two_versions_says_what_to_do(console: Console) -> None:
    client, apis, login = console
    gov = _use(apis, _Gov())
    login("dev", "ml-developer")
    reply = client.get(f"/data/churn/diff?a={V1}")
    assert reply.status_code == 400 and "choose two versions" in reply.text
    assert gov.diffs == []


def test_the_lineage_page_and_fragment(console: Console) -> None:
    client, apis, login = console
    _use(apis, _Gov())
    login("sam", "data-steward")
    page = client.get("/data/churn/lineage?version=bbbb")
    assert page.status_code == 200
    assert 'data-testid="lineage-edges"' in page.text
    assert 'data-node="model_version:churn-classifier:2"' in page.text
    # a data steward may not read jobs nor models: the nodes are drawn without links
    assert 'href="/jobs/j-1"' not in page.text and 'href="/models/' not in page.text
    fragment = client.get("/data/churn/lineage", headers={"hx-request": "true"})
    assert fragment.status_code == 200 and "<html" not in fragment.text


def test_a_service_refusal_is_a_403_page(console: Console) -> None:
    client, apis, login = console
    _use(apis, _Gov(refuse=True))
    login("aud", "auditor")
    reply = client.get("/data")
    assert reply.status_code == 403 and "Refused" in reply.text


#: A policy in which an annotator only lists datasets (tokens must name a shipped role).
_LISTER_POLICY = """
version: 1
roles:
  annotator:
    description: sees datasets, reads no rows
    rules:
      - actions: [list]
        resources: [dataset]
"""


def test_a_role_that_may_read_no_rows_is_told_why_and_nothing_is_read(
    tmp_path: Path, data_dir: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(_LISTER_POLICY)
    settings = ConsoleSettings(data_dir=data_dir, console=ConsoleOptions(policy_file=policy))
    app = build_app(settings)
    apis = FakeApis(settings)
    app.state.apis = apis
    gov = _use(apis, _Gov())
    with TestClient(app, base_url=ORIGIN, follow_redirects=False) as client:
        token = create_token(data_dir, "lee", ["annotator"], dt.timedelta(hours=1))
        client.post("/login", data={"token": token}, headers={"origin": ORIGIN})
        page = client.get("/data/churn")
        assert page.status_code == 200
        assert 'data-testid="preview-refused"' in page.text
        assert 'data-testid="view-policy"' not in page.text
        preview = client.get("/data/churn/preview")
        assert preview.status_code == 200
        assert "your role may not read the rows" in preview.text
        assert gov.reads == []


def _viewer(*roles: str) -> Viewer:
    return Viewer("u", roles, "t", dt.datetime.now(dt.UTC), Authorizer(default_policy()))


def test_choose_view_follows_the_policy() -> None:
    assert choose_view(_viewer("platform-admin"), "")[0] == "raw"
    assert choose_view(_viewer("ml-developer"), "")[0] == "deidentified"
    assert choose_view(_viewer("annotator"), "deidentified")[0] == "deidentified"
    assert choose_view(_viewer("auditor"), "")[0] == ""
    with pytest.raises(PermissionDenied):
        choose_view(_viewer("ml-developer"), "raw", "churn")


def test_human_bytes() -> None:
    assert human_bytes(0) == "0 B"
    assert human_bytes(512) == "512 B"
    assert human_bytes(81_000) == "79.1 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"


class _WideGov(_Gov):
    """A version read by many jobs; its reads record whether the stream was closed."""

    closed = False

    def lineage(self, **kw: Any) -> list[LineageEdge]:
        return [
            LineageEdge("dataset_version", f"churn@{V2}", "job", f"j-{i}", i) for i in range(90)
        ]

    def read_batches(self, *args: Any, **kw: Any) -> Iterator[tuple[str, pa.Table]]:
        try:
            yield from super().read_batches(*args, **kw)
        finally:
            _WideGov.closed = True


def test_big_lineage_is_bounded_and_the_preview_stream_is_closed(console: Console) -> None:
    client, apis, login = console
    _use(apis, _WideGov())
    login("dev", "ml-developer")
    page = client.get("/data/churn")
    assert 'data-node="job:j-79"' in page.text and 'data-node="job:j-80"' not in page.text
    assert "10 more edges are not drawn" in page.text
    lineage = client.get("/data/churn/lineage")
    assert "10 more edges are not shown" in lineage.text
    assert client.get("/data/churn/preview").status_code == 200
    assert _WideGov.closed
