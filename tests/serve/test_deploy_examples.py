"""examples/serve/kubernetes.yaml, run as the Deployment would run it: its
ConfigMap's files as the rules directory, its environment, its probe path,
its ports; then a ConfigMap edit (the files swapped) reloads in place."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request

import yaml

from conftest import REPO, OK, binary, free_port, request
import grpc
from envoy.service.ratelimit.v3 import rls_pb2_grpc


def test_kubernetes_example(tmp_path, redis_server):
    docs = list(yaml.safe_load_all((REPO / "examples/serve/kubernetes.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    rules = tmp_path / "rules"
    rules.mkdir()
    for name, text in kinds["ConfigMap"]["data"].items():
        (rules / name).write_text(text)
    container = kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["THROTTLEGATE_RULES"] == container["volumeMounts"][0]["mountPath"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 8081, "http": 8080}
    env.update(THROTTLEGATE_RULES=str(rules), THROTTLEGATE_URL=redis_server.url)
    grpc_port, http_port = free_port(), free_port()
    env.update(THROTTLEGATE_GRPC=f"127.0.0.1:{grpc_port}", THROTTLEGATE_HTTP=f"127.0.0.1:{http_port}")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("THROTTLEGATE_")}
    p = subprocess.Popen([binary(), "serve"], env={**clean, **env}, stderr=subprocess.PIPE, text=True)
    try:
        start = json.loads(p.stderr.readline())
        assert start["event"] == "start" and start["backend"] != "memory" and start["domains"] == 1
        probe = container["readinessProbe"]["httpGet"]["path"]
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{probe}", timeout=5) as r:
            assert r.status == 200
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as ch:
            stub = rls_pb2_grpc.RateLimitServiceStub(ch)
            r = stub.ShouldRateLimit(request("edge", [("user", "k8s-" + str(grpc_port))]))
            assert r.overall_code == OK and r.statuses[0].current_limit.requests_per_unit == 100
            # RESPONSE_HEADERS is on in the example.
            assert any(h.key == "RateLimit-Policy" for h in r.response_headers_to_add)
            # A ConfigMap edit: the mounted file is replaced; the server reloads it.
            (rules / "edge.yaml").write_text((rules / "edge.yaml").read_text().replace("requests_per_unit: 100", "requests_per_unit: 50"))
            while True:
                line = json.loads(p.stderr.readline())
                if line["event"] in ("reload", "reload_refused"):
                    break
            assert line["event"] == "reload"
            r = stub.ShouldRateLimit(request("edge", [("user", "k8s-" + str(grpc_port))]))
            assert r.statuses[0].current_limit.requests_per_unit == 50 and r.statuses[0].limit_remaining == 48
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0


def test_dockerfile_runs_what_it_copies(tmp_path):
    """No container runtime here: the Dockerfile's command, environment and
    copied rules are checked against the binary instead."""
    lines = (REPO / "examples/serve/Dockerfile").read_text().splitlines()
    entry = next(json.loads(l.split(" ", 1)[1]) for l in lines if l.startswith("ENTRYPOINT "))
    assert entry == ["throttlegate", "serve"]
    env = dict(l.split(" ", 1)[1].split("=", 1) for l in lines if l.startswith("ENV "))
    copies = {l.split()[-1]: l.split()[-2] for l in lines if l.startswith("COPY examples/")}
    rules = copies[env["THROTTLEGATE_RULES"]]
    assert (REPO / rules).exists()
    build = next(l for l in lines if l.startswith("RUN cargo build"))
    assert "-p throttlegate-cli" in build and "--locked" in build
    r = subprocess.run([binary(), "lint", str(REPO / rules)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout
    assert {"8080", "8081"} <= set(next(l for l in lines if l.startswith("EXPOSE ")).split()[1:])
    ignored = (REPO / ".dockerignore").read_text().split()
    assert "target" in ignored
