#!/usr/bin/env python3
"""The sizes and glibc floors of the release artifacts in dist/, measured.

    scripts/artifact-sizes.py DIST VERSION ARCHIVE PLATFORM
        writes DIST/sizes.md: one Markdown table row per artifact found (file
        size, unpacked size of its binaries, the newest GLIBC_ symbol version
        they need, read with `objdump -T`), and prints it;
    ... --update DOC   then puts the table into DOC between the lines
        `<!-- artifact sizes: make dist -->` and `<!-- /artifact sizes -->`
        (`make dist` does so for docs/getting-started/install.md);
    ... --check DOC    fails when DOC's table names other artifacts or glibc
        floors, or a size more than 10% off (test-packaging, which builds
        the same artifacts); with --only REGEX, only the rows whose artifact
        name matches (those built in the release profile there).

Run by scripts/dist.sh, so no figure of the table is written by hand.
"""
import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile

BEGIN = "<!-- artifact sizes: make dist -->"
END = "<!-- /artifact sizes -->"
TOLERANCE = 0.10


def human(n):
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f} MB"
    return f"{max(1, round(n / 1000))} kB"


def glibc_floor(path):
    """The newest GLIBC_x.y version among the dynamic symbols of a binary."""
    out = subprocess.run(["objdump", "-T", path], check=True, capture_output=True, text=True).stdout
    versions = {tuple(int(p) for p in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", out)}
    if not versions:
        return "none"
    return ".".join(str(p) for p in max(versions))


def measure(dist, version, archive, platform):
    """(artifact, what it is, file size, unpacked, glibc) for each artifact found."""
    rows = []
    tmp = tempfile.mkdtemp()

    def save(t, member):
        """Write a member of a tarball into tmp, under a name of its own."""
        out = os.path.join(tmp, f"{len(os.listdir(tmp))}-{os.path.basename(member.name)}")
        with open(out, "wb") as f:
            f.write(t.extractfile(member).read())
        return out

    def path(name):
        p = os.path.join(dist, name)
        return p if os.path.exists(p) else None

    wheels = sorted(f for f in os.listdir(dist) if f.startswith(f"throttlegate-{version}-") and f.endswith(".whl"))
    for wheel in wheels:
        with zipfile.ZipFile(os.path.join(dist, wheel)) as z:
            info = z.getinfo("throttlegate/_native.abi3.so")
            ext = os.path.join(tmp, f"{len(os.listdir(tmp))}-_native.abi3.so")
            with open(ext, "wb") as f:
                f.write(z.read(info))
        rows.append((wheel, "Python 3.9+", os.path.getsize(os.path.join(dist, wheel)),
                     f"{human(info.file_size)} extension", glibc_floor(ext)))
    p = path(f"throttlegate-{version}.tar.gz")
    if p:
        rows.append((os.path.basename(p), "the sdist: core, Lua, Python binding", os.path.getsize(p), "", ""))
    p = path(f"throttlegate-{version}.tgz")
    if p:
        rows.append((os.path.basename(p), "npm `throttlegate`: JavaScript and types", os.path.getsize(p), "", ""))
    p = path(f"throttlegate-{platform}-{version}.tgz")
    if p:
        with tarfile.open(p) as t:
            member = t.getmember(f"package/throttlegate.{platform}.node")
            node = save(t, member)
        rows.append((os.path.basename(p), "npm: the addon", os.path.getsize(p), f"{human(member.size)} addon",
                     glibc_floor(node)))
    p = path(f"throttlegate-{version}-{archive}.tar.gz")
    if p:
        top = f"throttlegate-{version}-{archive}"
        with tarfile.open(p) as t:
            so = t.getmember(f"{top}/lib/libthrottlegate.so.0")
            a = t.getmember(f"{top}/lib/libthrottlegate.a")
            so_file = save(t, so)
        rows.append((os.path.basename(p), "C", os.path.getsize(p), f"`.so` {human(so.size)}, `.a` {human(a.size)}",
                     glibc_floor(so_file)))
    p = path(f"throttlegate-cli-{version}-{archive}.tar.gz")
    if p:
        top = f"throttlegate-cli-{version}-{archive}"
        with tarfile.open(p) as t:
            exe = t.getmember(f"{top}/throttlegate")
            exe_file = save(t, exe)
        rows.append((os.path.basename(p), "the command", os.path.getsize(p), f"{human(exe.size)} binary",
                     glibc_floor(exe_file)))
    return rows


def table(rows):
    lines = ["| artifact | file | unpacked | glibc |", "| --- | ---: | ---: | ---: |"]
    for name, what, size, unpacked, glibc in rows:
        lines.append(f"| `{name}` ({what}) | {human(size)} | {unpacked} | {glibc} |")
    return "\n".join(lines) + "\n"


def block(text, doc):
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"{doc}: expected one `{BEGIN}` ... `{END}` block")
    start = text.index(BEGIN) + len(BEGIN) + 1
    return start, text.index(END)


def figures(line):
    """The sizes of a table row in bytes, in order."""
    return [float(n) * (1_000_000 if u == "MB" else 1000) for n, u in re.findall(r"(\d+(?:\.\d+)?) (MB|kB)", line)]


def check(doc, built, only=None):
    text = open(doc, encoding="utf-8").read()
    start, end = block(text, doc)
    written = text[start:end].strip().splitlines()
    built = built.strip().splitlines()
    problems = []
    if len(written) != len(built):
        problems.append(f"{len(written) - 2} artifacts written, {len(built) - 2} built")
    compared = 0
    for w, b in zip(written[2:], built[2:]):
        if only and not re.search(only, b.split("`")[1]):
            continue
        compared += 1
        strip = lambda line: re.sub(r"\d+(?:\.\d+)? (MB|kB)", "N", line)
        if strip(w) != strip(b):
            problems.append(f"written: {w}\n    built: {b}")
            continue
        for fw, fb in zip(figures(w), figures(b)):
            if abs(fw - fb) > TOLERANCE * fb:
                problems.append(f"written: {w}\n    built: {b}")
                break
    if problems:
        sys.exit(f"{doc}: its artifact table is not make dist's (run `make dist`, which rewrites it):\n  "
                 + "\n  ".join(problems))
    print(f"{doc}: the artifact table matches the {compared} artifacts compared (sizes within {TOLERANCE:.0%})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dist")
    ap.add_argument("version")
    ap.add_argument("archive")
    ap.add_argument("platform")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--update", metavar="DOC")
    group.add_argument("--check", metavar="DOC")
    ap.add_argument("--only", metavar="REGEX")
    args = ap.parse_args()
    rows = measure(args.dist, args.version, args.archive, args.platform)
    out = table(rows)
    with open(os.path.join(args.dist, "sizes.md"), "w", encoding="utf-8") as f:
        f.write(out)
    print(out, end="")
    if args.update:
        text = open(args.update, encoding="utf-8").read()
        start, end = block(text, args.update)
        with open(args.update, "w", encoding="utf-8") as f:
            f.write(text[:start] + out + text[end:])
        print(f"{args.update}: the artifact table rewritten")
    if args.check:
        check(args.check, out, args.only)


if __name__ == "__main__":
    main()
