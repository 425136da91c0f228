"""What importing a package's face pulls in: Spark's Python workers import the connector's
source and sink, and must not load trio (the import contracts check modules, not what a
package's __init__ brings along). Each check runs in a fresh interpreter, since this
one has loaded everything already."""

import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_spark_workers_imports_do_not_load_trio():
    done = _run(
        "import spark_connector.source, spark_connector.sink, sys\n"
        "assert 'trio' not in sys.modules, sorted(m for m in sys.modules if m.startswith('episub'))"
    )
    assert done.returncode == 0, done.stderr


def test_importing_episub_alone_does_not_load_trio():
    done = _run("import episub, sys; assert 'trio' not in sys.modules")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("package", ["episub", "episub.config", "episub.agent"])
def test_every_public_name_imports_from_the_face_and_is_the_modules_own(package):
    done = _run(
        f"import importlib\n"
        f"face = importlib.import_module({package!r})\n"
        f"names = list(face.__all__)\n"
        f"exec('from {package} import ' + ', '.join(names))\n"
        "for name in names:\n"
        "    value = getattr(face, name)\n"
        "    home = importlib.import_module(getattr(value, '__module__', face.__name__))\n"
        "    assert getattr(home, name) is value, name\n"
        "assert set(names) <= set(dir(face))\n"
        "print(len(names))"
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 7


def test_an_unknown_name_is_an_attribute_error_and_a_renamed_one_warns():
    import episub

    with pytest.raises(AttributeError, match="no_such_name"):
        episub.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    with pytest.warns(DeprecationWarning, match="use episub.Delivery"):
        assert episub.Message is episub.Delivery  # type: ignore[attr-defined]
