"""Run every code example of docs/ and README.md (make test-docs).

Each fenced block is run by its language (see docs/project/development.md):
python and js on the embedded backend or a redis-server started here (every
redis://127.0.0.1:6379 in an example points at it), c compiled against the
library and run, toml/json policies through `throttlegate lint`, scenarios
through `throttlegate simulate`, envoyproxy/ratelimit YAML through lint (an
Envoy fragment parsed and checked against examples/serve/envoy.yaml, which the
serve suite runs), `throttlegate` lines of sh blocks run (`serve` until
healthy), rust
blocks checked to be doc tests of tests/docs (cargo test -p throttlegate-docs).
A block in another language fails: an example nobody runs is not allowed.

Usage: run_examples.py [FILE.md ...]   (default: README.md and docs/**/*.md)
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY = os.environ.get("DOCS_PYTHON", str(ROOT / ".venv" / "bin" / "python"))
CLI = os.environ.get("THROTTLEGATE_CLI", str(ROOT / "target" / "debug" / "throttlegate"))
CC = os.environ.get("CC", "cc")
DOCS_PY = str(ROOT / "target" / "docs-venv" / "bin" / "python")  # has PyYAML (make docs installs it)
SHOWN_ONLY = {"text"}
FENCE = re.compile(r"^```([\w,+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)

PY_PREAMBLE = "import throttlegate\nlimiter = throttlegate.Limiter('rules.toml')\nrequest_id, used_tokens = 'req-1', 812\n"
JS_PREAMBLE = "const { Limiter } = require('throttlegate');\nconst limiter = new Limiter('rules.toml');\nconst requestId = 'req-1', usedTokens = 812;\n"
C_PREAMBLE = """#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <throttlegate.h>
int main(void) {
    tg_policy *policy = NULL; tg_limiter *limiter = NULL; tg_decision *d = NULL;
    if (tg_policy_from_file("rules.toml", &policy) != TG_OK || tg_limiter_new(policy, "memory://", &limiter) != TG_OK) {
        fprintf(stderr, "%s\\n", tg_last_error_message()); return 1;
    }
    tg_limiter *l = limiter; tg_attribute attrs[] = {{"ip", "203.0.113.7"}, {"tenant", "t1"}};
    const char *request_id = "req-1"; uint64_t used_tokens = 812;
    (void)l; (void)attrs; (void)request_id; (void)used_tokens; (void)d;
"""
C_END = "\n    return 0;\n}\n"

# Run a Python example and, when it defines an app, send it one request.
PY_HARNESS = r'''
import ast, asyncio, sys
path = sys.argv[1]
src = open(path).read()
code = compile(src, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
import types
module = types.ModuleType("__docs__")          # importable: Django's ROOT_URLCONF = __name__
module.__file__ = path
sys.modules["__docs__"] = module
g = module.__dict__
result = eval(code, g)
if asyncio.iscoroutine(result):
    asyncio.run(result)
app = g.get("app") or g.get("application")
if app is not None:
    if hasattr(app, "test_client"):                       # Flask
        r = app.test_client().get("/")
        status, headers = r.status_code, r.headers
    else:
        try:
            from starlette.testclient import TestClient
            with TestClient(app, client=("203.0.113.7", 50000)) as client:
                r = client.get("/")
            status, headers = r.status_code, r.headers
        except Exception as e:  # a WSGI app
            if "ASGI" in repr(e) or not callable(app):
                raise
            from wsgiref.util import setup_testing_defaults
            env = {}; setup_testing_defaults(env); env["REMOTE_ADDR"] = "203.0.113.7"
            seen = {}
            def start_response(s, h, exc_info=None):
                seen["status"], seen["headers"] = s, dict(h)
            b"".join(app(env, start_response))
            status, headers = int(seen["status"].split()[0]), seen["headers"]
    if status != 200 or "ratelimit-limit" not in {k.lower() for k in dict(headers)}:
        sys.exit(f"GET / answered {status} with headers {dict(headers)}: expected 200 with RateLimit-Limit")
'''


class Failure(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, cwd, ok=(0,), timeout=120, env=None, stdin=None):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, input=stdin)
    if p.returncode not in ok:
        raise Failure(f"{' '.join(str(c) for c in cmd if chr(10) not in str(c))} exited with {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


class Runner:
    def __init__(self, work: Path, redis_url: str):
        self.work = work
        self.redis_url = redis_url
        self.n = 0
        self.env = dict(os.environ, NODE_PATH=str(ROOT / "node_modules"))

    def prepare(self, src: str) -> str:
        return src.replace("redis://127.0.0.1:6379", self.redis_url)

    def file(self, name: str, text: str) -> Path:
        self.n += 1
        p = self.work / f"ex{self.n:03d}_{name}"
        p.write_text(text)
        return p

    def python(self, src: str) -> None:
        if "Limiter(" not in src and "import throttlegate" not in src:
            src = PY_PREAMBLE + src
        p = self.file("example.py", self.prepare(src))
        run([PY, "-c", PY_HARNESS, str(p)], self.work, env=self.env)

    def js(self, src: str) -> None:
        if "Limiter(" not in src:
            src = JS_PREAMBLE + src
        src = self.prepare(src)
        esm = re.search(r"^import ", src, re.M) is not None
        if ".listen(" in src:
            port = free_port()
            p = self.file("app.mjs" if esm else "app.js", src)
            proc = subprocess.Popen(["node", str(p)], cwd=self.work, env=dict(self.env, PORT=str(port)),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                deadline = time.time() + 30
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                            if r.status != 200 or r.headers.get("RateLimit-Limit") is None:
                                raise Failure(f"GET / answered {r.status} without RateLimit-Limit")
                            return
                    except (ConnectionError, urllib.error.URLError):
                        if proc.poll() is not None or time.time() > deadline:
                            raise Failure(f"the app did not answer on port {port}: {proc.stderr.read() if proc.poll() is not None else ''}")
                        time.sleep(0.2)
            finally:
                proc.kill()
                proc.wait()
        if not esm and "await " in src and "async function" not in src and "async (" not in src:
            src = "(async () => {\n" + src + "\n})().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });\n"
        p = self.file("example.mjs" if esm else "example.js", src)
        run(["node", str(p)], self.work, env=self.env, timeout=60)

    def c(self, src: str) -> None:
        if "int main" not in src:
            src = C_PREAMBLE + src + C_END
        p = self.file("example.c", self.prepare(src))
        exe = p.with_suffix("")
        lib = self.work / "lib"          # the library under the name it is installed as
        if not lib.exists():
            lib.mkdir()
            (lib / "libthrottlegate.so.0").symlink_to(ROOT / "target" / "debug" / "libthrottlegate_c.so")
            (lib / "libthrottlegate.so").symlink_to("libthrottlegate.so.0")
        run([CC, "-std=c11", "-Wall", "-I", str(ROOT / "bindings" / "c" / "include"), str(p), "-o", str(exe),
             "-L", str(lib), "-lthrottlegate", f"-Wl,-rpath,{lib}"], self.work)
        run([str(exe)], self.work)

    def policy(self, src: str, ext: str) -> None:
        p = self.file(f"policy.{ext}", src)
        run([CLI, "lint", "--any-attributes", str(p)], self.work, ok=(0, 1))

    def toml(self, src: str) -> None:
        if "[[phases]]" in src:
            p = self.file("scenario.toml", src)
            run([CLI, "simulate", "--rules", "rules.toml", "--scenario", str(p)], self.work)
        elif "[[rules]]" in src:
            self.policy(src, "toml")
        else:
            raise Failure("a toml block that is neither a policy nor a scenario")

    def json(self, src: str) -> None:
        if '"rules"' not in src:
            raise Failure("a json block that is not a policy (show output as ```text)")
        self.policy(src, "json")

    def yaml(self, src: str) -> None:
        if "descriptors:" in src:
            # envoyproxy/ratelimit's rules, which lint (and serve) read.
            p = self.file("rules.yaml", src)
            run([CLI, "lint", "--any-attributes", str(p)], self.work, ok=(0, 1))
            # The latest rules are rules.yaml too, for a `throttlegate serve` line after them.
            (self.work / "rules.yaml").write_text(src)
            return
        # An Envoy configuration fragment: it parses, and its filter and types are those of
        # examples/serve/envoy.yaml, which the serve suite runs with a real Envoy.
        run([DOCS_PY, "-c", "import sys, yaml; yaml.safe_load(sys.stdin.read())"], self.work, stdin=src)
        envoy = (ROOT / "examples" / "serve" / "envoy.yaml").read_text()
        for value in re.findall(r'(?:name|"@type"|cluster_name): *([\w.@/-]+)', src):
            if value not in envoy:
                raise Failure(f"{value} is not in examples/serve/envoy.yaml, which the serve tests run")

    def serve(self, args: list[str]) -> None:
        """`throttlegate serve ...`: started on free loopback ports, healthy, then stopped."""
        http_port, grpc_port = free_port(), free_port()
        proc = subprocess.Popen([CLI, *args, "--http", f"127.0.0.1:{http_port}", "--grpc", f"127.0.0.1:{grpc_port}"],
                                cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthcheck", timeout=5) as r:
                        if r.status == 200:
                            return
                except (ConnectionError, urllib.error.URLError):
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise Failure(f"throttlegate {' '.join(args)} did not become healthy: "
                                  f"{proc.stderr.read() if proc.poll() is not None else ''}")
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait()

    def sh(self, src: str) -> None:
        lines = src.replace("\\\n", " ").split("\n")
        for line in lines:
            line = line.split(" #", 1)[0].strip()
            if not line.startswith("throttlegate "):
                continue
            args = self.prepare(line).split()[1:]
            if args[0] == "serve":
                self.serve(args)
                continue
            # lint and diff exit with 1 for warnings and differences; check with 1 for a denial.
            run([CLI, *args], self.work, ok=(0, 1))


def blocks(md: Path):
    text = md.read_text()
    for m in FENCE.finditer(text):
        line = text[: m.start()].count("\n") + 1
        yield m.group(1).split(",")[0], m.group(2), line


def check_policy_reference() -> list[str]:
    """Every field the parser accepts has a heading in the policy reference, and no other."""
    src = (ROOT / "core" / "src" / "policy.rs").read_text()
    fields = set()
    for name in ("TOP_FIELDS", "RULE_FIELDS"):
        m = re.search(rf"const {name}: &\[&str\] = &\[(.*?)\];", src, re.S)
        if not m:
            return [f"core/src/policy.rs: {name} not found"]
        fields |= set(re.findall(r'"(\w+)"', m.group(1)))
    page = (ROOT / "docs" / "reference" / "policy.md").read_text()
    documented = set(re.findall(r"^### `(\w+)`$", page, re.M))
    errors = [f"docs/reference/policy.md: field `{f}` is not documented" for f in sorted(fields - documented)]
    # Every documented field is used by a policy of the page, which run_examples loads with lint.
    policies = "\n".join(src for lang, src, _ in blocks(ROOT / "docs" / "reference" / "policy.md") if lang == "toml")
    used = set(re.findall(r"^\s*(\w+)\s*=|^\[\[?(\w+)", policies, re.M))
    used = {a or b for a, b in used} | set(re.findall(r"[{,]\s*(\w+)\s*=", policies))
    errors += [f"docs/reference/policy.md: no policy on the page uses `{f}`" for f in sorted(documented - used)]
    errors += [f"docs/reference/policy.md: `{f}` is documented but the parser has no such field"
               for f in sorted(documented - fields)]
    return errors


def check_rust_included(files: list[Path]) -> list[str]:
    lib = (ROOT / "tests" / "docs" / "src" / "lib.rs").read_text()
    errors = []
    for md in files:
        if any(lang == "rust" for lang, _, _ in blocks(md)):
            rel = os.path.relpath(md, ROOT / "tests" / "docs" / "src")
            if f'include_str!("{rel}")' not in lib:
                errors.append(f"{md.relative_to(ROOT)}: has rust blocks but tests/docs/src/lib.rs does not include it")
    return errors


def check_readme_links() -> list[str]:
    """The README's relative links name files of the repository (the site's are checked by make docs)."""
    text = (ROOT / "README.md").read_text()
    errors = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        if not (ROOT / target.split("#")[0]).exists():
            errors.append(f"README.md: the link {target} names no file of the repository")
    return errors


def main() -> int:
    files = [Path(a).resolve() for a in sys.argv[1:]] or [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    errors = check_policy_reference() + check_rust_included(files) + check_readme_links()
    install = (ROOT / "docs" / "getting-started" / "install.md").read_text()
    m = re.search(r"<!-- rules.toml -->\n```toml\n(.*?)^```", install, re.M | re.S)
    if not m:
        errors.append("docs/getting-started/install.md: no <!-- rules.toml --> block")
        print("\n".join(errors))
        return 1
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL)
    work = Path(tempfile.mkdtemp(prefix="docs-examples-"))
    counts: dict[str, int] = {}
    started = time.time()
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        (work / "rules.toml").write_text(m.group(1))
        for name in ("old.toml", "new.toml"):
            (work / name).write_text(m.group(1))
        (work / "examples").symlink_to(ROOT / "examples")
        (work / "node_modules").mkdir()
        (work / "node_modules" / "throttlegate").symlink_to(ROOT)
        runner = Runner(work, f"redis://127.0.0.1:{port}")
        for md in files:
            for lang, src, line in blocks(md):
                where = f"{md.relative_to(ROOT)}:{line}"
                lang = {"javascript": "js", "bash": "sh", "shell": "sh", "yml": "yaml"}.get(lang, lang)
                if lang in SHOWN_ONLY or lang == "rust":
                    continue
                fn = getattr(runner, lang, None) if lang in ("python", "js", "c", "toml", "json", "sh", "yaml") else None
                if fn is None:
                    errors.append(f"{where}: a ```{lang or '(no language)'} block: no test runs it "
                                  "(use a language that runs, or ```text for output)")
                    continue
                try:
                    fn(src)
                    counts[lang] = counts.get(lang, 0) + 1
                except (Failure, subprocess.TimeoutExpired) as e:
                    errors.append(f"{where}: the {lang} example failed: {e}")
    finally:
        redis.kill()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)
    summary = ", ".join(f"{n} {lang}" for lang, n in sorted(counts.items()))
    print(f"docs examples: ran {summary} in {time.time() - started:.0f}s")
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    print(f"{sum(counts.values())} passed, {len(errors)} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
