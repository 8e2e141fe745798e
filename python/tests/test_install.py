"""pip install of the package works offline, and the installed copy runs."""
import os
import shutil
import subprocess
import sys

import pytest

import mempool

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_offline_into_a_target_dir(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if r.returncode != 0:
        pytest.skip("pip is not installed for %s" % sys.executable)
    # A copy: setuptools writes build/ and *.egg-info beside the sources.
    src = tmp_path / "src"
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", "tests"))
    target = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index",
                        "--no-build-isolation", "--no-deps", "--target", str(target), str(src)],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "mempool" / "__init__.py").exists()
    code = ("import mempool, sys\n"
            "assert mempool.__file__.startswith(sys.argv[1]), mempool.__file__\n"
            "d = mempool.Device('host:capacity=16M')\n"
            "p = mempool.Pool(d)\n"
            "a = p.alloc(100); p.free(a)\n"
            "print(p.stats()['allocation.all.allocated'])\n"
            "p.destroy(); d.close()\n")
    env = dict(os.environ, PYTHONPATH=str(target), MEMPOOL_LIBRARY=mempool.library_path())
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
