"""Comments and documents name things that exist.

Comments are the map of this code: a comment or a page that names a file, a
function in a file, a dotted ``outbox.`` path or an ``OUTBOX`` setting that is
gone sends the next reader nowhere. These tests read every tracked text file of
the project and check four kinds of reference:

- a path of the project's own (``outbox/worker/loop.py``, ``worker/loop.py``,
  ``tests/servers.py``, or a bare ``loop.py``) names a file that exists;
- a file followed by a name (`` `worker/loop.py`, `SenderLoop.run` ``, the
  style of ``PROTOCOL.md``) names something that file defines;
- a dotted path (``outbox.worker.loop.SenderLoop``) imports;
- in the comments and docstrings of ``outbox/``, a symbol named with a dotted
  path (``outbox.worker.attempt.Sender``, a model's field such as
  ``outbox.models.Delivery.status``), or short from within its own package
  (``settling.Settling``, :meth:`Sender.hand_over`), is there;
- ``OUTBOX["NAME"]`` names a setting (``outbox.conf.DEFAULTS``).

And one reference the tests must not make: no module under ``tests/`` imports
a test module (``tests.test_*``, ``tests.worker.test_*``, ...). What several
test modules share lives in a helper module (``tests/servers.py``,
``tests/delivery.py``, ``tests/processes.py``, ...), where the next reader looks
for it.

Reports of past runs (``tests/*/results/``) are left out: they record what the
code was when they were made. So are django-anymail's vendored tests
(``tests/anymail_upstream/``, but for its README): their text is anymail's.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from functools import cache

import pytest

from outbox.conf import DEFAULTS
from tests.paths import ROOT

VENDORED = "tests/anymail_upstream/"
SCANNED = (".py", ".md", ".sh", ".lua", ".toml", ".html", ".cfg")

# Files named in the text that are not the project's: each with why.
EXTERNAL_FILES = {
    "tests.py": "a file of Django's own tests/mail/",
    "test_backends.py": "a file of Django's own tests/mail/",
    "test_deprecated.py": "a file of Django's own tests/mail/",
    "test_handler.py": "a file of Django's own tests/mail/",
    "sitecustomize.py": "Python's start-up hook (the site module), written by a test for a subprocess",
}

# A path token: words and slashes ending in a scanned suffix, not part of a
# longer path or URL (no letter, dot, slash or dash right before it).
PATH = re.compile(r"(?<![\w./$-])((?:[\w-]+/)*[\w-]+\.(?:py|lua|sh|md|toml))\b")
# `file.py`, `name` or `file.py` `Name.attr()`: a file and a name it defines.
FILE_AND_NAME = re.compile(
    r"`((?:[\w-]+/)*[\w-]+\.(?:py|lua))`(?:,| in| \(|:)? *`([A-Za-z_]\w*)(?:\.\w+)*(?:\(\))?`"
)
# A dotted path; a check id (``outbox.E005``) is not one, nor a quoted logger
# or file name ("outbox.esp", "outbox.sqlite3").
DOTTED = re.compile(r"(?<![\w.'\"])(outbox(?:\.(?![EW]\d{3}\b)[A-Za-z_]\w*)+)")
SETTING = re.compile(r"""OUTBOX\[["']([A-Z_]+)["']\]""")


@cache
def tracked() -> tuple[str, ...]:
    """The repository's files, as git lists them (the working tree's, untracked included)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(path for path in out.split() if (ROOT / path).is_file())


def scanned() -> list[str]:
    def read(path: str) -> bool:
        if path == ".ci/run":
            return True
        return (
            path.endswith(SCANNED)
            and "/results/" not in path
            and not path.startswith("outbox/migrations/")
            and path != "tests/project/test_references.py"  # its docstrings show the forms it reads
            # django-anymail's tests, vendored unchanged: their text is anymail's.
            and not (path.startswith(VENDORED) and path != f"{VENDORED}README.md")
        )

    return [path for path in tracked() if read(path)]


def project_roots() -> set[str]:
    """First components a project path may start with: top folders and outbox's packages."""
    roots = {"outbox", "tests", "example_project", ".ci"}
    roots |= {p.name for p in (ROOT / "outbox").iterdir() if p.is_dir() and p.name != "__pycache__"}
    roots |= {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    return roots


def resolve(path: str) -> str | None:
    """The tracked file that ``path`` names (itself, or a suffix of one), or None."""
    for candidate in tracked():
        if candidate == path or candidate.endswith("/" + path):
            return candidate
    return None


def lines() -> list[tuple[str, int, str]]:
    found = []
    for path in scanned():
        text = (ROOT / path).read_text(encoding="utf-8", errors="replace")
        found += [(path, n, line) for n, line in enumerate(text.splitlines(), 1)]
    return found


def test_named_files_exist() -> None:
    roots = project_roots()
    missing = []
    for path, n, line in lines():
        for match in PATH.finditer(line):
            name = match.group(1)
            first = name.split("/", 1)[0] if "/" in name else None
            if first is None and name in EXTERNAL_FILES:
                continue
            if first is not None and first not in roots:
                continue  # another project's file (django/..., psycopg/...)
            if resolve(name) is None:
                missing.append(f"{path}:{n}: {name}")
    assert not missing, "files named but not in the tree:\n" + "\n".join(missing)


def defines(path: str, name: str) -> bool:
    text = (ROOT / path).read_text(encoding="utf-8")
    pattern = (
        rf"^\s*(?:async\s+def|def|class|local\s+function|function)\s+{name}\b"
        rf"|^\s*(?:local\s+)?{name}\s*(?::[^=]*)?="
        rf"|FUNCTION\s+{name}\b"  # a PL/pgSQL function in a DDL text
    )
    return re.search(pattern, text, re.MULTILINE) is not None


def test_names_in_named_files_exist() -> None:
    missing = []
    for path, n, line in lines():
        for match in FILE_AND_NAME.finditer(line):
            file, name = match.groups()
            target = resolve(file)
            if target is not None and not defines(target, name):
                missing.append(f"{path}:{n}: {name} in {target}")
    assert not missing, "names that their file does not define:\n" + "\n".join(missing)


def has(obj: object, attr: str) -> bool:
    """Whether ``obj.attr`` is there: an attribute, a class's annotated field, a model's field."""
    if hasattr(obj, attr):
        return True
    if not isinstance(obj, type):
        return False
    if any(attr in vars(c).get("__annotations__", {}) for c in obj.__mro__):
        return True  # a dataclass's field without a default, or an instance attribute
    meta = getattr(obj, "_meta", None)  # a model: Options.get_field, as documented
    if meta is not None:
        try:
            meta.get_field(attr)
        except Exception:  # FieldDoesNotExist, or a _meta that is not a model's
            return False
        return True
    return False


def found_in(obj: object, attrs: list[str]) -> bool:
    """Whether ``obj.a.b...`` (``attrs``) is there, one attribute after the other."""
    for attr in attrs:
        if not has(obj, attr):
            return False
        obj = getattr(obj, attr, None)
    return True


def importable(dotted: str) -> bool:
    """Whether ``dotted`` names something: its longest importable prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return found_in(obj, parts[cut:])
    return False


def permissions() -> set[str]:
    """The outbox's permissions as ``user.has_perm`` names them: ``outbox.<codename>``."""
    from django.apps import apps

    names = set()
    for model in apps.get_app_config("outbox").get_models():
        opts = model._meta  # Meta.default_permissions and Meta.permissions, as documented
        names |= {f"outbox.{action}_{opts.model_name}" for action in opts.default_permissions}
        names |= {f"outbox.{codename}" for codename, _ in opts.permissions}
    return names


def test_dotted_paths_import() -> None:
    missing = set()
    perms = permissions()
    for path, n, line in lines():
        for match in DOTTED.finditer(line):
            dotted = match.group(1).rstrip(".")
            if dotted not in perms and not importable(dotted):
                missing.add(f"{path}:{n}: {dotted}")
    assert not missing, "dotted paths that do not import:\n" + "\n".join(sorted(missing))


def comments_and_docstrings(path: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of each comment and each docstring's line in the module at ``path``."""
    source = (ROOT / path).read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    text = source.splitlines()
    docstringed = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(source, filename=path)):
        if not (isinstance(node, docstringed) and node.body):
            continue
        first = node.body[0]
        value = first.value if isinstance(first, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            for n in range(first.lineno, (first.end_lineno or first.lineno) + 1):
                yield n, text[n - 1]


# A short dotted name (``settling.Settling``, ``sql.mark_row()``), not part of a
# path or of a longer name; and the target of a Sphinx role (:class:`~outbox.x.Y`,
# :meth:`Sender.hand_over`, :func:`pause`), which may be a single name.
SHORT = re.compile(r"(?<![\w./-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")
ROLE = re.compile(r":[a-z]+:`~?\.?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?`")


def ours(obj: object) -> bool:
    """Whether ``obj`` (a name a module binds) is the outbox's own: a module or a definition."""
    name = obj.__name__ if isinstance(obj, type(importlib)) else getattr(obj, "__module__", None)
    return isinstance(name, str) and name.split(".")[0] == "outbox"


# Short dotted names in outbox's comments that are prose, not a symbol of the
# module their first part names: each with why.
PROSE_NAMES = {
    "message.anymail_status.message_id": "a message's anymail attribute, not outbox.mail.message",
}


def short_name_found(module: str, dotted: str) -> bool | None:
    """Whether ``dotted``, written in ``module``, is there; None if it is not a name of ours.

    Its first part is looked up as the module would: a name the module binds
    (the outbox's own, else it is not ours), else a module of the same package
    that no library's top-level name shadows (``email``, ``django``). A first
    part that is neither (a word, a column, a library's name) is not checked.
    """
    first, *rest = dotted.split(".")
    namespace = importlib.import_module(module)
    if first in vars(namespace):
        bound = vars(namespace)[first]
        return found_in(bound, rest) if ours(bound) else None
    package = module if hasattr(namespace, "__path__") else module.rpartition(".")[0]
    if importlib.util.find_spec(f"{package}.{first}") is None:
        return None
    try:
        library = importlib.util.find_spec(first) is not None
    except ImportError:
        library = False
    if library:
        return None
    return found_in(importlib.import_module(f"{package}.{first}"), rest)


def test_symbols_in_comments_and_docstrings_exist() -> None:
    """A comment that names a symbol rather than a file stays true: the symbol is checked.

    In every module of ``outbox/`` (the migrations' comments too, not their SQL),
    a name of the outbox's own is checked wherever it is written: ``outbox.`` and
    the rest, or short, as its module would look it up (``settling.Settling`` in
    ``outbox/worker/``). A short name whose first part the module does not know
    as the outbox's (``time.monotonic``, ``e.g``) is prose, and left alone.
    """
    perms = permissions()
    modules = [p for p in tracked() if p.startswith("outbox/") and p.endswith(".py")]
    missing = set()
    for path in modules:
        module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for n, text in comments_and_docstrings(path):
            for name in DOTTED.findall(text):
                if name.rstrip(".") not in perms and not importable(name.rstrip(".")):
                    missing.add(f"{path}:{n}: {name}")
            for name in SHORT.findall(text) + ROLE.findall(text):
                if name.split(".")[0] == "outbox" or name in PROSE_NAMES:
                    continue  # checked above, or prose
                if short_name_found(module, name) is False:
                    missing.add(f"{path}:{n}: {name}")
    assert not missing, "symbols named but not there:\n" + "\n".join(sorted(missing))


def test_each_kind_of_symbol_is_looked_up() -> None:
    module = "outbox.worker.outcomes"
    assert short_name_found(module, "settling.Settling.alone") is True  # a module of its package
    assert short_name_found(module, "settling.Settling.gone") is False
    assert short_name_found(module, "settling.py") is False  # a file named the old way
    assert short_name_found(module, "Settlement.outcome") is True  # a name it binds
    assert short_name_found(module, "time.monotonic") is None  # not the outbox's
    assert short_name_found("outbox.compat.email", "email.message.Message") is None  # the library
    assert importable("outbox.models.Delivery.recipient")  # a model's field
    assert importable("outbox.models.Email.deliveries")  # and a relation's other end
    assert not importable("outbox.models.Delivery.recipients")


def test_named_settings_exist() -> None:
    missing = []
    for path, n, line in lines():
        if is_test_module(path):
            continue  # tests name wrong settings on purpose
        for match in SETTING.finditer(line):
            if match.group(1) not in DEFAULTS:
                missing.append(f"{path}:{n}: OUTBOX[{match.group(1)!r}]")
    assert not missing, "settings named but not in outbox.conf.DEFAULTS:\n" + "\n".join(missing)


@pytest.mark.parametrize("name", sorted(EXTERNAL_FILES))
def test_external_names_are_not_ours(name: str) -> None:
    """An allowed outside name must not hide a stale reference to a file of ours."""
    assert resolve(name) is None


def is_test_module(path: str) -> bool:
    """Whether ``path`` is a test module: ``tests/test_*.py`` or ``tests/<folder>/.../test_*.py``."""
    return path.startswith("tests/") and path.rsplit("/", 1)[-1].startswith("test_")


def imports_of_test_modules(path: str, source: str) -> set[tuple[int, str]]:
    """(line, name) of each test module that ``source``, the file at ``path``, imports.

    A test module is ``tests.test_*`` or one in a folder, ``tests.worker.test_*``.

    Every spelling counts: ``import tests.test_x``, ``from tests.test_x import
    name``, ``from tests import test_x``, and relative imports, resolved
    against the file's package; inside a function too.
    """
    package = path.removesuffix(".py").split("/")[:-1]
    found = set()
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "tests":
                continue
            # Down the folders of tests/ to a test module; past a helper module
            # (tests.servers), what follows are names in it.
            for depth in range(2, len(parts) + 1):
                if not ROOT.joinpath(*parts[: depth - 1]).is_dir():
                    break
                if parts[depth - 1].startswith("test_"):
                    found.add((node.lineno, ".".join(parts[:depth])))
                    break
    return found


def test_each_spelling_of_importing_a_test_module_is_found() -> None:
    source = (
        "import tests.test_a\n"
        "from tests.test_b import helper\n"
        "from tests import test_c\n"
        "from .test_d import helper\n"
        "def f():\n"
        "    from . import test_e\n"
        "from tests.servers import test_data\n"  # a name in a helper module
        "import test_f\n"  # not under tests
        "from tests.worker.test_g import helper\n"  # a test module in a folder
        "from tests.faults import test_h\n"
    )
    found = imports_of_test_modules("tests/test_z.py", source)
    assert sorted(found) == [
        (1, "tests.test_a"),
        (2, "tests.test_b"),
        (3, "tests.test_c"),
        (4, "tests.test_d"),
        (6, "tests.test_e"),
        (9, "tests.worker.test_g"),
        (10, "tests.faults.test_h"),
    ]
    # Relative imports resolve against the folder of the module that makes them.
    nested = imports_of_test_modules(
        "tests/faults/test_z.py", "from .test_i import helper\nfrom ..worker import test_j\n"
    )
    assert sorted(nested) == [(1, "tests.faults.test_i"), (2, "tests.worker.test_j")]


def test_no_module_under_tests_imports_a_test_module() -> None:
    """What test modules share lives in helper modules, where the next reader looks for it."""
    imports = []
    for path in tracked():
        if path.startswith("tests/") and path.endswith(".py") and "/results/" not in path:
            source = (ROOT / path).read_text(encoding="utf-8")
            imports += [(path, *found) for found in imports_of_test_modules(path, source)]
    assert not imports, (
        "test modules imported by other modules; move what they share to a helper module:\n"
        + "\n".join(f"{path}:{n}: {name}" for path, n, name in sorted(imports))
    )
