"""`chatledger export` and `chatledger import`, run through `engine._cli.main` on every backend."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest

from chatledger.engine._cli import main
from chatledger.store import Store
from tests.conftest import fresh_database
from tests.store.test_transfer import build, row_counts


@pytest.fixture
def seeded(database_url: str) -> tuple[str, str, list[str]]:
    """A database with a conversation and its fork: (url, tenant, their ids)."""
    tenant = f"cli-{uuid.uuid4().hex[:8]}"
    with Store.open(database_url) as store:
        ids = list(build(store.tenant(tenant)))
    return database_url, tenant, ids


@pytest.fixture
def target_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fresh_database(backend, request, tmp_path)


def test_export_to_a_file_then_import_it_into_another_database(
    seeded: tuple[str, str, list[str]],
    target_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, tenant, ids = seeded
    file = tmp_path / "out" / "export.jsonl"
    file.parent.mkdir()
    assert main(["export", "--database-url", url, "--tenant", tenant, "--output", str(file)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("Exported 2 conversations, ") and str(file) in err
    assert err.count("\n") == 1 and "\r" not in err  # no progress line off a terminal
    assert [p.name for p in file.parent.iterdir()] == ["export.jsonl"]  # nothing left aside

    assert main(["import", str(file), "--database-url", target_url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["tenant"] == tenant
    assert sorted(report["conversations"]) == sorted(ids)
    assert report["alreadyPresent"] == [] and report["events"] > 0

    assert main(["import", str(file), "--database-url", target_url]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Imported 0 conversations (0 events) into tenant '{tenant}'; 2 were")
    assert out.count("\n") == 1  # the summary; `--json` lists the conversations

    assert main(["verify", "--database-url", target_url, "--tenant", tenant]) == 0
    assert "every chain is intact" in capsys.readouterr().out
    with Store.open(url) as source, Store.open(target_url) as target:
        for i in ids:
            assert target.tenant(tenant).history(i) == source.tenant(tenant).history(i)


def test_export_of_one_conversation_to_stdout(
    seeded: tuple[str, str, list[str]],
    target_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, tenant, (conv_id, fork_id) = seeded
    args = ["export", "--database-url", url, "--tenant", tenant, "--conversation", fork_id]
    assert main(args) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert json.loads(lines[0])["tenant"] == tenant and json.loads(lines[-1])["type"] == "end"
    assert "to stdout" in err
    file = tmp_path / "fork.jsonl"
    file.write_text(out)
    assert main(["import", str(file), "--database-url", target_url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["conversations"] == [conv_id, fork_id]


def test_a_terminal_sees_a_bar_of_the_events(
    seeded: tuple[str, str, list[str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, tenant, _ = seeded
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    file = tmp_path / "export.jsonl"
    assert main(["export", "--database-url", url, "--tenant", tenant, "-o", str(file)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("\rexporting: ")  # the bar (tqdm), rewritten in place
    assert err.splitlines()[-1].lstrip("\r ").startswith("Exported 2 conversations")


def test_a_refused_file_is_one_line_naming_its_line_and_writes_nothing(
    seeded: tuple[str, str, list[str]],
    target_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, tenant, _ = seeded
    file = tmp_path / "export.jsonl"
    assert main(["export", "--database-url", url, "--tenant", tenant, "-o", str(file)]) == 0
    lines = file.read_text().splitlines(keepends=True)
    file.write_text("".join(lines[:-2]))
    capsys.readouterr()
    with Store.open(target_url) as target:
        before = row_counts(target)
    assert main(["import", str(file), "--database-url", target_url]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"chatledger: error: Line {len(lines) - 1} of the import file: ")
    with Store.open(target_url) as target:
        assert row_counts(target) == before


def test_files_that_cannot_be_opened_are_usage_errors(
    database_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.jsonl"
    assert main(["import", str(missing), "--database-url", database_url]) == 1
    assert "Cannot read" in capsys.readouterr().err
    nowhere = tmp_path / "no-such-directory" / "export.jsonl"
    assert main(["export", "--database-url", database_url, "-o", str(nowhere)]) == 1
    assert "Cannot write" in capsys.readouterr().err
    assert not nowhere.parent.exists()
