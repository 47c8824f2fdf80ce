"""The docs stand alone: every local link resolves, and nothing points outside the repository.

Checked files: README.md, docs/*.md, experiments/README.md, benchmarks/README.md. Two kinds of
local reference are resolved:
- markdown links `[text](target)` (outside fenced code), relative to the file that holds them;
  `target#anchor` must name a heading of the target (GitHub's anchor rule), `#anchor` alone one
  of the same file;
- bare repository paths such as `docs/training.md` or `docs/models.md#sampler` (anywhere, code
  spans included), relative to the repository root, as the docs write them.
Separately, no file of the repository (code, docs, tests, this module aside) may mention the
private notes folder the project was planned from: the docs must be readable without it.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = sorted(
    [
        ROOT / "README.md",
        ROOT / "experiments" / "README.md",
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

_FENCE = re.compile(r"^\s*(```|~~~)")
_MD_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
# A bare path as the docs write them: docs/<name>.md, or a top folder's README.
_BARE_PATH = re.compile(
    r"(?<![\w./-])((?:docs/[\w.-]+\.md|(?:experiments|benchmarks)/README\.md)(?:#[\w-]+)?)"
)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# A file of the repository named by its path (`sao_jax/train/config.py`); a glob
# (`test_rollout_*.py`) or a metric name (`serving/requests`) has no extension right after.
_CODE_PATH = re.compile(
    r"(?<![\w./-])((?:sao_jax|atdp_io|serving|experiments|benchmarks|tests|examples|devtools)"
    r"/[\w/.-]*\.(?:py|md|toml|json|ya?ml|sh))(?![\w*-])"
)
_PYTHON_M = re.compile(r"python3? -m ([\w.]+)")
# Spelled in pieces so this module does not match its own check.
_FORBIDDEN = ("../" + "shared", "shared" + "/docs")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: rendered text, lower case, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading anchor of a markdown file (repeats get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    result = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return frozenset(result)


def _check_target(target: str, base: Path, source: Path) -> str | None:
    """None when `target` (path[#anchor], relative to `base`) resolves; else why not."""
    path_part, _, anchor = target.partition("#")
    path = (base / path_part).resolve() if path_part else source
    if not path.exists():
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return f"{target}: no such file {shown}"
    if anchor and path.suffix == ".md" and anchor.lower() not in anchors(path):
        return f"{target}: {path.name} has no heading with anchor #{anchor}"
    return None


def local_references(path: Path) -> list[tuple[int, str, Path]]:
    """(line, target, the folder it is relative to) of every local reference in `path`."""
    text = path.read_text(encoding="utf-8")
    found = []
    for number, line in _prose_lines(text):
        for match in _MD_LINK.finditer(line):
            target = match.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            found.append((number, target, path.parent))
    for number, line in enumerate(text.splitlines(), start=1):
        for match in _BARE_PATH.finditer(line):
            # skip the path part of a markdown link already checked above
            if line[max(match.start() - 2, 0) : match.start()].endswith("("):
                continue
            found.append((number, match.group(1), ROOT))
    return found


def code_references(path: Path) -> list[tuple[int, str]]:
    """(line, what) of every repository file path and `python -m` module the file names that
    does not exist."""
    missing = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in _CODE_PATH.finditer(line):
            if not (ROOT / match.group(1)).is_file():
                missing.append((number, match.group(1)))
        for match in _PYTHON_M.finditer(line):
            module = match.group(1)
            if module.split(".")[0] not in _LOCAL_PACKAGES:
                continue  # pip, pytest, venv: not ours
            base = ROOT.joinpath(*module.split("."))
            if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
                missing.append((number, f"python -m {module}"))
    return missing


_LOCAL_PACKAGES = ("sao_jax", "atdp_io", "serving", "experiments", "benchmarks", "examples")


def test_doc_files_exist():
    missing = [str(path.relative_to(ROOT)) for path in DOC_FILES if not path.exists()]
    assert not missing
    assert (ROOT / "docs" / "algorithms.md") in DOC_FILES
    assert (ROOT / "docs" / "architecture.md") in DOC_FILES


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_local_links_resolve(doc: Path):
    broken = []
    for number, target, base in local_references(doc):
        problem = _check_target(target, base, doc)
        if problem:
            broken.append(f"{doc.relative_to(ROOT)}:{number}: {problem}")
    assert not broken, "broken local links:\n" + "\n".join(broken)


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_named_files_and_modules_exist(doc: Path):
    """Code moves; a guide that names a file or a `python -m` module must follow it."""
    missing = [f"{doc.relative_to(ROOT)}:{n}: {what}" for n, what in code_references(doc)]
    assert not missing, "files or modules named in the docs that do not exist:\n" + "\n".join(
        missing
    )


def _repository_files() -> list[Path]:
    """Tracked and untracked-but-not-ignored files (a walk without git)."""
    try:
        listing = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [ROOT / name for name in listing.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        skip = {"__pycache__", "runs", "build", "dist", "node_modules"}
        return [
            path
            for path in ROOT.rglob("*")
            if path.is_file()
            and not any(
                part.startswith(".") or part in skip for part in path.parts[len(ROOT.parts) :]
            )
        ]


def forbidden_mentions(paths: list[Path]) -> list[str]:
    """`path:line: text` of every line of `paths` that names the private notes folder."""
    offenders = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable files hold no reference
        for number, line in enumerate(text.splitlines(), start=1):
            if any(word in line for word in _FORBIDDEN):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                offenders.append(f"{shown}:{number}: {line.strip()[:100]}")
    return offenders


def test_no_file_points_outside_the_repository():
    files = [
        path for path in _repository_files() if path.is_file() and path != Path(__file__).resolve()
    ]
    assert len(files) > 100  # the listing found the repository
    offenders = forbidden_mentions(files)
    assert not offenders, "references to a folder outside the repository:\n" + "\n".join(offenders)


def test_checker_catches_broken_links(tmp_path):
    """The checks above would see a missing file, a missing anchor and a bare path."""
    (tmp_path / "a.md").write_text("# Real heading\n\ntext\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text(
        "[ok](a.md#real-heading) [gone](missing.md) [bad](a.md#nope) [self](#top)\n"
        "```\n[in code](ignored.md)\n```\n# Top\n[web](https://example.com)\n",
        encoding="utf-8",
    )
    references = local_references(doc)
    targets = [target for _, target, _ in references]
    assert targets == ["a.md#real-heading", "missing.md", "a.md#nope", "#top"]
    problems = [_check_target(target, base, doc) for _, target, base in references]
    assert problems[0] is None and problems[3] is None
    assert "no such file" in problems[1]
    assert "no heading with anchor #nope" in problems[2]
    assert slug("`token_logprobs(logits, tokens)` -> [B, T]") == "token_logprobslogits-tokens---b-t"
    assert slug("SAO: Single-rollout [Asynchronous](x.md) Optimization") == (
        "sao-single-rollout-asynchronous-optimization"
    )
    bare = local_references(_write(tmp_path / "c.md", "see `docs/nowhere.md` and docs/x.md#y\n"))
    assert [target for _, target, _ in bare] == ["docs/nowhere.md", "docs/x.md#y"]


def test_forbidden_mentions_are_found(tmp_path):
    bad = _write(tmp_path / "bad.py", "ok\n# see " + _FORBIDDEN[0] + "/docs/atdp.md\n")
    also_bad = _write(tmp_path / "bad.md", "background in " + _FORBIDDEN[1] + "\n")
    good = _write(tmp_path / "good.md", "see docs/algorithms.md\n")
    found = forbidden_mentions([bad, also_bad, good])
    assert [line.split(":")[-2] for line in found] == ["2", "1"]


def test_code_reference_checker(tmp_path):
    doc = _write(
        tmp_path / "d.md",
        "`sao_jax/train/config.py` `sao_jax/train/nowhere.py` `tests/x/test_a_*.py`\n"
        "metric `serving/requests`; python -m experiments.alfworld_sao; python -m serving\n"
        "python -m experiments.gone and python -m pip install\n",
    )
    assert [what for _, what in code_references(doc)] == [
        "sao_jax/train/nowhere.py",
        "python -m experiments.gone",
    ]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
