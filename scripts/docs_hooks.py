"""MkDocs hooks for the throttlegate site (mkdocs.yml: hooks).

What the site shows that is made at build time, from the project itself:

- `<!-- simulate: NAME -->`: a chart of `throttlegate simulate --json` run on
  docs/concepts/boundary/NAME.toml with the boundary-burst scenario (the CLI is
  built by scripts/docs.sh; its path comes in THROTTLEGATE_CLI).
- `<!-- chart: label=COLUMN values="COLUMN;COLUMN" unit="TEXT" -->` right before a
  Markdown table: a bar chart of those columns, drawn from the table itself.
- `<!-- signatures: PATH -->`: the Python stub or the TypeScript declarations,
  one section per class, function or type, read from the committed file.
- `](repo:PATH)`: a link to a file of the repository (it must exist).
- Rust blocks as mdBook and rustdoc write them: `rust,no_run` is shown as
  `rust`, and lines starting with `# ` (setup the doc tests need) are hidden.
- rustdoc's output (`cargo doc -p throttlegate --no-deps`, target/doc) is
  added to the site under api/rust/.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
REPO_BLOB = "https://github.com/throttlegate/throttlegate/blob/main/"
BOUNDARY = ROOT / "docs" / "concepts" / "boundary"

_runs: dict[str, dict] = {}


class DocsError(PluginError):
    """A marker the hook cannot fill: the build fails with this message."""


# ---------------------------------------------------------------- simulate


def _simulate(name: str) -> dict:
    if name not in _runs:
        cli = os.environ.get("THROTTLEGATE_CLI", str(ROOT / "target" / "debug" / "throttlegate"))
        policy = BOUNDARY / f"{name}.toml"
        if not policy.exists():
            raise DocsError(f"simulate: no policy {policy}")
        out = subprocess.run(
            [cli, "simulate", "--rules", str(policy), "--scenario", str(BOUNDARY / "scenario.toml"), "--json"],
            check=True, capture_output=True, text=True,
        ).stdout
        _runs[name] = json.loads(out)
    return _runs[name]


def boundary_chart(name: str) -> str:
    """An SVG of one algorithm's allowed and denied requests per interval."""
    run = _simulate(name)
    ivs = run["intervals"]
    step_ms = run["interval_ms"]
    rule = next(iter(ivs[0]["rules"]))
    allowed = [iv["rules"][rule]["allowed"] for iv in ivs]
    denied = [iv["rules"][rule]["denied"] for iv in ivs]
    per_window = 60_000 // step_ms
    most = max(sum(allowed[i:i + per_window]) for i in range(len(allowed)))
    w, h, left, bottom, top = 640, 220, 44, 34, 26
    peak = max(a + d for a, d in zip(allowed, denied)) or 1
    bw = (w - left - 30) / len(ivs)
    sy = (h - top - bottom) / peak
    parts = [
        f'<svg class="tg-chart" role="img" viewBox="0 0 {w} {h}" width="100%" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{html.escape(rule)}: requests allowed and denied every {step_ms // 1000} s</title>",
        '<defs><pattern id="hatch-%s" width="4" height="4" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        '<rect width="4" height="4" fill="#7a1f1f"/><line x1="0" y1="0" x2="0" y2="4" stroke="#e0b0b0" stroke-width="1.5"/>'
        "</pattern></defs>" % name,
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(rule)}: at most {most} admitted in any 60 s (limit 100)</text>',
    ]
    base = h - bottom
    for i, (a, d) in enumerate(zip(allowed, denied)):
        x = left + i * bw
        if a:
            parts.append(f'<rect x="{x:.1f}" y="{base - a * sy:.1f}" width="{bw - 1:.1f}" height="{a * sy:.1f}" fill="#8fc1e3"/>')
        if d:
            parts.append(
                f'<rect x="{x:.1f}" y="{base - (a + d) * sy:.1f}" width="{bw - 1:.1f}" height="{d * sy:.1f}" fill="url(#hatch-{name})"/>'
            )
    for t in range(0, run["duration_ms"] + 1, 60_000):
        x = left + t / step_ms * bw
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{base}" stroke="#444" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x:.1f}" y="{base + 14}" font-size="11" text-anchor="middle">{t // 1000} s</text>')
    parts.append(f'<line x1="{left}" y1="{base}" x2="{w - 30}" y2="{base}" stroke="#444"/>')
    parts.append(f'<text x="{left - 4}" y="{base - peak * sy + 4:.1f}" font-size="11" text-anchor="end">{peak}</text>')
    parts.append(f'<text x="{left - 4}" y="{base + 4}" font-size="11" text-anchor="end">0</text>')
    parts.append(
        f'<text x="{w - 10}" y="{h - 4}" font-size="11" text-anchor="end">requests per {step_ms // 1000} s: '
        "allowed (light), denied (dark, hatched); dashed: window boundaries</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- tables


def _number(cell: str) -> float:
    m = re.search(r"-?[\d,]*\.?\d+", cell.replace("**", ""))
    if not m:
        raise DocsError(f"chart: no number in table cell {cell!r}")
    return float(m.group(0).replace(",", ""))


def table_chart(spec: str, table: list[str]) -> str:
    """A horizontal bar chart of some columns of a Markdown table."""
    opts = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', spec))
    opts = {k: v.strip('"') for k, v in opts.items()}
    cells = [[c.strip() for c in row.strip().strip("|").split("|")] for row in table]
    head, rows = cells[0], cells[2:]
    try:
        label_cols = [head.index(c) for c in opts["label"].split(";")]
        value_cols = [head.index(c) for c in opts["values"].split(";")]
    except ValueError as e:
        raise DocsError(f"chart: {e} in table header {head}") from None
    colours = ["#3b7dbf", "#e08a2c", "#6aa84f", "#9b59b6"]
    bar, gap, left, w = 14, 10, 300, 720
    series = len(value_cols)
    vmax = max(_number(r[c]) for r in rows for c in value_cols) or 1
    top = 14 + 16 * series
    h = top + len(rows) * (series * bar + gap) + 20
    parts = [f'<svg class="tg-chart" role="img" viewBox="0 0 {w} {h}" width="100%" xmlns="http://www.w3.org/2000/svg">']
    parts.append(f"<title>{html.escape(opts.get('title', 'chart'))}</title>")
    for j, c in enumerate(value_cols):
        parts.append(f'<rect x="{left}" y="{6 + 16 * j}" width="12" height="12" fill="{colours[j]}"/>')
        parts.append(f'<text x="{left + 16}" y="{16 + 16 * j}" font-size="12">{html.escape(head[c])}</text>')
    y = top
    for r in rows:
        label = " · ".join(r[c].replace("**", "").replace("`", "") for c in label_cols)
        parts.append(
            f'<text x="{left - 6}" y="{y + series * bar / 2 + 4}" font-size="12" text-anchor="end">{html.escape(label)}</text>'
        )
        for j, c in enumerate(value_cols):
            v = _number(r[c])
            bw = max(1.0, (w - left - 90) * v / vmax)
            parts.append(f'<rect x="{left}" y="{y + j * bar}" width="{bw:.1f}" height="{bar - 2}" fill="{colours[j]}"/>')
            parts.append(f'<text x="{left + bw + 4:.1f}" y="{y + j * bar + bar - 4}" font-size="11">{v:,.10g}</text>')
        y += series * bar + gap
    parts.append(f'<text x="{w - 4}" y="{h - 4}" font-size="11" text-anchor="end">{html.escape(opts.get("unit", ""))}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ---------------------------------------------------------------- signatures

_PY_TOP = re.compile(r"^(class|def|async def) (\w+)|^(\w+)\s*[:=]", re.M)
_TS_TOP = re.compile(r"^export (?:declare )?(?:const enum|class|function|interface|type|const|enum) (\w+)", re.M)


def signatures(path: str) -> str:
    """The stub or declarations file as one section per top-level item.

    Decorators and comments right above an item belong to it; a stub's
    module-level names (constants, aliases) make one section of their own.
    """
    src = (ROOT / path).read_text()
    lang = "python" if path.endswith(".pyi") else "ts"
    pattern = _PY_TOP if lang == "python" else _TS_TOP
    lines = src.split("\n")
    items = []  # (first line, name, is a module-level name)
    for m in pattern.finditer(src):
        line = src.count("\n", 0, m.start())
        while line > 0 and lines[line - 1].lstrip().startswith(("@", "#", "/**", "*", "//")):
            line -= 1
        name = next(g for g in m.groups() if g and g not in ("class", "def", "async def"))
        items.append((line, name, lang == "python" and m.group(3) is not None))
    if not items:
        raise DocsError(f"signatures: nothing found in {path}")
    out = [f"Rendered from [`{path}`](repo:{path}) when the site is built.\n"]
    preamble = "\n".join(lines[: items[0][0]]).strip()
    if preamble:
        out.append(f"```{lang}\n{preamble}\n```\n")
    i = 0
    while i < len(items):
        j = i + 1
        if items[i][2]:
            while j < len(items) and items[j][2]:
                j += 1
        end = items[j][0] if j < len(items) else len(lines)
        chunk = "\n".join(lines[items[i][0]:end]).strip()
        if items[i][2]:
            names = [f"`{n}`" for _, n, _ in items[i:j]]
            title = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        else:
            title = f"`{items[i][1]}`"
        out.append(f"### {title}\n\n```{lang}\n{chunk}\n```\n")
        i = j
    return "\n".join(out)


# ---------------------------------------------------------------- hooks

_FENCE = re.compile(r"^```rust(?:,[\w,]+)?\n(.*?)^```$", re.M | re.S)


def _rust_block(m: re.Match) -> str:
    lines = [l for l in m.group(1).split("\n") if not (l.startswith("# ") or l == "#")]
    return "```rust\n" + "\n".join(lines) + "```"


def _repo_link(m: re.Match) -> str:
    path = m.group(1)
    target = path.split("#")[0]
    if not (ROOT / target).exists():
        raise DocsError(f"repo link: {path} is not a file of the repository")
    return f"]({REPO_BLOB}{path})"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001
    src = page.file.src_path
    try:
        markdown = _FENCE.sub(_rust_block, markdown)
        markdown = re.sub(
            r"^<!-- signatures: (\S+) -->$", lambda m: signatures(m.group(1)), markdown, flags=re.M
        )
        markdown = re.sub(r"\]\(repo:([^)\s]+)\)", _repo_link, markdown)
        markdown = re.sub(
            r"^<!-- simulate: (\w+) -->$", lambda m: boundary_chart(m.group(1)), markdown, flags=re.M
        )

        def chart(m: re.Match) -> str:
            table = m.group(2).rstrip("\n").split("\n")
            return table_chart(m.group(1), table) + "\n\n" + m.group(2)

        markdown = re.sub(r"^<!-- chart: (.*?) -->\n((?:\|.*\n)+)", chart, markdown, flags=re.M)
    except DocsError as e:
        raise DocsError(f"{src}: {e}") from None
    return markdown


def on_files(files, config):  # noqa: ANN001
    rustdoc = ROOT / "target" / "doc"
    if not (rustdoc / "throttlegate" / "index.html").exists():
        raise DocsError("target/doc/throttlegate is missing: run `cargo doc -p throttlegate --no-deps` (scripts/docs.sh does)")
    for path in rustdoc.rglob("*"):
        # (Markdown files there are font licences, not pages: left out.)
        if path.is_file() and not path.name.startswith(".lock") and path.suffix != ".md":
            rel = path.relative_to(rustdoc).as_posix()
            files.append(File.generated(config, f"api/rust/{rel}", abs_src_path=str(path)))
    return files
