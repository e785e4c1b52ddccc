"""`throttlegate lint` and `diff` read envoyproxy/ratelimit's YAML as `serve` does."""

from __future__ import annotations

import subprocess

from conftest import REPO, binary


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary(), *args], capture_output=True, text=True, timeout=30)


def test_lint_and_diff_read_yaml(tmp_path):
    example = REPO / "examples/serve/ratelimit.yaml"
    r = run("lint", str(example))
    assert r.returncode == 0 and "no problems found" in r.stdout
    changed = tmp_path / "changed.yaml"
    changed.write_text(example.read_text().replace("requests_per_unit: 10", "requests_per_unit: 20"))
    r = run("diff", str(example), str(changed))
    assert r.returncode == 1 and "~ edge.remote_address: limit changed; state kept" in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: x\ndescriptors:\n  - key: a\n    burst: 1\n")
    r = run("lint", str(bad))
    assert r.returncode == 2 and "descriptors[0].burst: unknown field" in r.stdout
    # A directory of YAML files, one domain each.
    d = tmp_path / "config"
    d.mkdir()
    (d / "a.yaml").write_text(example.read_text())
    (d / "b.yml").write_text("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
    r = run("lint", str(d))
    assert r.returncode == 0, r.stdout


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Rate limit service\n", 1)[1].split("\n## ", 1)[0]


def test_readme_examples(serve, tmp_path):
    import json
    import urllib.request

    blocks = readme_section().split("```yaml\n")[1:]
    rules = blocks[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text(rules)
    r = run("lint", str(path))
    assert r.returncode == 0, r.stdout
    s = serve(path)
    body = json.dumps({"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "u1"}]}]}).encode()
    with urllib.request.urlopen(urllib.request.Request(s.http + "/json", data=body, method="POST"), timeout=5) as resp:
        assert resp.status == 200 and json.loads(resp.read())["overallCode"] == "OK"
    # The README's example file, served as its command line shows.
    s2 = serve(REPO / "examples/serve/ratelimit.yaml")
    assert s2.check("edge", [("path", "/login"), ("api_key", "k")]).statuses[0].current_limit.requests_per_unit == 5
