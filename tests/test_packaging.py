"""The wheel is what a user installs: it carries the type marker of both packages, the
license, and the metadata that says which Python and PySpark it supports."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_carries_py_typed_the_license_and_the_supported_range(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("episub-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(archive.read(metadata).decode())
        license_files = [n for n in names if n.endswith("/licenses/LICENSE")]
        assert license_files, sorted(names)
        assert b"Apache License" in archive.read(license_files[0])
    assert {"episub/py.typed", "spark_connector/py.typed"} <= names
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    assert meta["Requires-Python"] == ">=3.11"
    spark = [r for r in meta.get_all("Requires-Dist") if r.startswith("pyspark")]
    assert spark == ['pyspark[connect]<5,>=4.2; extra == "spark"']
