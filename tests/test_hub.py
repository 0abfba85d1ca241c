"""A Hub model id without waiting on the network (wellfed/hub.py): a cached model loads with no
request at all; one that is not cached fails in one line naming the cause (no network, no such
model, HF_HUB_OFFLINE), without huggingface_hub's retries. No test here needs the network: the
Hub is a closed local port, or a tiny local server that answers as the Hub does."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import PROJECT
from wellfed import hub

LOAD = ("from wellfed.cli import guarded; from wellfed.model import load_tokenizer, "
        "resolve_source; guarded(lambda: print(type(load_tokenizer(resolve_source({name!r})))"
        ".__name__), 'tokenize')")


class FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hub answers for a repository it does not have."""

    paths: list[str] = []

    def do_GET(self):
        FakeHub.paths.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeHub.paths = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port() -> str:
    with socket.socket() as s:  # bound, never listened on, then closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def load(name: str, endpoint: str, cache: Path, offline: str = ""):
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache),
           "HF_HUB_OFFLINE": offline, "PYTHONPATH": str(PROJECT / "src")}
    return subprocess.run([sys.executable, "-c", LOAD.format(name=name)], env=env,
                          capture_output=True, text=True, timeout=300)


def cache_with(cache: Path, repo_id: str, model_dir: Path) -> Path:
    """`repo_id` in a Hub cache laid out as huggingface_hub lays it out, from `model_dir`."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(model_dir, repo / "snapshots" / ("0" * 40))
    return repo


def test_no_network_and_not_cached_fails_in_one_line_without_retries(tmp_path):
    proc = load("someorg/some-model", closed_port(), tmp_path / "cache")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()  # no "Retrying in 1s" lines before it
    assert line.startswith(f"error: model.name: 'someorg/some-model' is not in the Hugging Face "
                           f"cache ({tmp_path / 'cache'}) and the Hugging Face Hub "
                           "(http://127.0.0.1:")
    assert "cannot be reached (ConnectError:" in line and "connect this machine" in line
    assert "disk space" not in line


def test_a_model_the_hub_does_not_have_is_named_so(tmp_path, fake_hub):
    proc = load("someorg/no-such-model", fake_hub, tmp_path / "cache")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line == (f"error: model.name: the Hugging Face Hub ({fake_hub}) has no model "
                    "'someorg/no-such-model' (or it is private and this machine is not logged "
                    "in: `hf auth login`); check the name, or use 'default' or a local model "
                    "directory")
    assert FakeHub.paths == ["/api/models/someorg/no-such-model"]  # asked once, not retried


def test_offline_and_not_cached_says_how_to_fetch_it(tmp_path):
    proc = load("someorg/some-model", closed_port(), tmp_path / "cache", offline="1")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert "HF_HUB_OFFLINE is on" in line
    assert line.endswith("HF_HUB_OFFLINE=0 hf download someorg/some-model")


@pytest.mark.integration
@pytest.mark.parametrize("offline", ["", "1"], ids=["online", "offline"])
def test_a_cached_model_loads_without_asking_the_hub(tmp_path, fake_hub, tiny_model_dir,
                                                     offline):
    """HF_HUB_OFFLINE unset and a Hub that answers every request: not one request is made."""
    cache_with(tmp_path / "cache", "someorg/tiny", tiny_model_dir)
    proc = load("someorg/tiny", fake_hub, tmp_path / "cache", offline=offline)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "BertTokenizer"  # transformers 5: the fast one
    assert FakeHub.paths == []


def test_a_load_the_cache_cannot_serve_asks_the_hub_then_downloads(monkeypatch):
    """The tokenize stage cached the tokenizer; training needs the weights: the cached-only load
    fails, the Hub is asked (the one-line check), and the load goes to the Hub."""
    calls, checked = [], []

    def loader(source, **kwargs):
        calls.append(kwargs.get("local_files_only", False))
        if kwargs.get("local_files_only"):
            raise OSError("someorg/tiny does not appear to have a file named model.safetensors")
        return "downloaded"

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "cached", lambda repo_id: True)
    monkeypatch.setattr(hub, "check", checked.append)
    assert hub.pretrained(loader, "someorg/tiny") == "downloaded"
    assert calls == [True, False] and checked == ["someorg/tiny"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the cache's answer is the answer
    with pytest.raises(OSError, match="model.safetensors"):
        hub.pretrained(loader, "someorg/tiny")


def test_a_library_error_without_errno_is_not_blamed_on_the_disk():
    from wellfed.cli import message

    assert message(OSError("someorg/x does not appear to have a file named config.json")) == \
        "someorg/x does not appear to have a file named config.json"
    assert message(OSError(28, "No space left on device", "data/x")).endswith(
        "check free disk space and permissions")
