"""rtj.kube.Kube.failed_at: set when a call fails for want of an API server (no connection, a 5xx),
not when the server answers (a 404 is an answer). Against a real local HTTP server and a closed port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client
from rtj import kube
from rtj_local.procs import free_port

pytestmark = pytest.mark.unit


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 503 if self.path.startswith("/api/v1/namespaces/down") else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind":"Status","code":%d}' % status)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def kube_at(host: str) -> kube.Kube:
    cfg = client.Configuration()
    cfg.host = host
    cfg.retries = 0
    return kube.Kube(client.ApiClient(cfg), request_timeout=5)


def test_an_answer_is_not_a_failure_a_503_is(server: str) -> None:
    k = kube_at(server)
    assert asyncio.run(k.get("Pod", "up", "p")) is None  # 404: answered
    assert k.failed_at is None
    with pytest.raises(kube.KubeError):
        asyncio.run(k.get("Pod", "down", "p"))
    assert k.failed_at is not None


def test_no_connection_is_a_failure() -> None:
    k = kube_at(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Exception):  # noqa: B017 (urllib3's error type is not ours to name)
        asyncio.run(k.get("Pod", "ns", "p"))
    assert k.failed_at is not None
