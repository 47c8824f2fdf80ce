"""No import cycle between the project's files or packages (`sao_jax.devtools.imports`), and the
checker itself on small trees with known cycles."""

from pathlib import Path

import pytest

from sao_jax.devtools import imports

ROOT = Path(__file__).resolve().parents[1]


def test_no_file_cycle():
    files, _ = imports.report(ROOT)
    assert not files, "import cycles between files:\n  " + "\n  ".join(files)


def test_no_package_cycle():
    _, packages = imports.report(ROOT)
    assert not packages, "import cycles between packages:\n  " + "\n  ".join(packages)


def test_every_package_is_read():
    graph = imports.import_graph(ROOT)
    for package in imports.PACKAGES:
        assert package in graph
    # a known edge, so a checker that reads nothing cannot pass the tests above
    assert "sao_jax.train.config" in graph["sao_jax.train.learner"]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_finds_a_file_cycle_and_names_it(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import f\n",
            "pkg/b.py": "def f():\n    from pkg import c  # lazy imports count too\n",
            "pkg/c.py": "from . import a\n",
            "pkg/d.py": "import pkg.a\n",
        },
    )
    files, packages = imports.report(root, ["pkg"])
    assert files == ["pkg.a -> pkg.b -> pkg.c -> pkg.a"]
    # the files of one top-level package's modules are units of their own
    assert packages == files


def test_submodule_imported_from_its_package_is_no_cycle(tmp_path):
    # `from pkg import mod` imports the submodule; the package's __init__ re-exporting it is
    # no cycle (Python runs the parent __init__ for every submodule import)
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
            "pkg/a.py": "from pkg import b\nA = 1\n",
            "pkg/b.py": "B = 2\n",
        },
    )
    assert imports.report(root, ["pkg"]) == ([], [])
    # a name the __init__ defines is read from it: that is a cycle
    (root / "pkg/b.py").write_text("from pkg import A\nB = A\n")
    files, _ = imports.report(root, ["pkg"])
    assert files == ["pkg -> pkg.b -> pkg (in a cycle with pkg.a too)"]


def test_finds_a_package_cycle_through_type_checking_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "top/__init__.py": "",
            "top/low/__init__.py": "",
            "top/low/x.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from top.high.y import Y\n"
            ),
            "top/high/__init__.py": "",
            "top/high/y.py": "from top.low import z\nY = 1\n",
            "top/low/z.py": "Z = 1\n",
        },
    )
    files, packages = imports.report(root, ["top"])
    assert files == []
    assert packages == ["top.high -> top.low -> top.high"]


def test_bad_input_is_reported(tmp_path):
    with pytest.raises(ValueError, match="no Python modules"):
        imports.report(tmp_path, ["missing"])
    _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .... import x\n"})
    with pytest.raises(ValueError, match="beyond the top"):
        imports.report(tmp_path, ["pkg"])
    (tmp_path / "pkg/a.py").write_text("def (:\n")
    with pytest.raises(ValueError, match="cannot parse"):
        imports.report(tmp_path, ["pkg"])


def test_main_prints_the_cycles(tmp_path, capsys):
    _tree(tmp_path, {"p/__init__.py": "", "p/a.py": "import p.b\n", "p/b.py": "import p.a\n"})
    assert imports.main([str(tmp_path)], packages=["p"]) == 1
    assert "p.a -> p.b -> p.a" in capsys.readouterr().out
    (tmp_path / "p/b.py").write_text("")
    assert imports.main([str(tmp_path)], packages=["p"]) == 0
    assert "file cycles: 0" in capsys.readouterr().out
