"""pip install of the package works offline, and the installed copy runs."""
import os
import shutil
import subprocess
import sys

import pytest

import mempool

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pip_install(tmp_path):
    """The package pip-installed (offline) into tmp_path/site, which it returns."""
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
    return target


USE = ("d = mempool.Device('host:capacity=16M')\n"
       "p = mempool.Pool(d)\n"
       "a = p.alloc(100); p.free(a)\n"
       "print(p.stats()['allocation.all.allocated'])\n"
       "p.destroy(); d.close()\n")


def test_pip_install_offline_into_a_target_dir(tmp_path):
    target = _pip_install(tmp_path)
    code = ("import mempool, sys\n"
            "assert mempool.__file__.startswith(sys.argv[1]), mempool.__file__\n" + USE)
    env = dict(os.environ, PYTHONPATH=str(target), MEMPOOL_LIBRARY=mempool.library_path())
    r = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"


def test_installed_package_finds_the_installed_library(tmp_path):
    """The pip-installed package, without $MEMPOOL_LIBRARY, loads a
    libmempool laid out as `cmake --install` lays it (libmempool.so ->
    .so.0 -> .so.0.1.0) in a directory on the loader's path, and
    library_path() names that file: a path that $MEMPOOL_LIBRARY and
    PyTorch's CUDAPluggableAllocator take (it was the bare name
    "libmempool.so.0", which $MEMPOOL_LIBRARY refuses)."""
    target = _pip_install(tmp_path)
    libdir = tmp_path / "prefix" / "lib"
    libdir.mkdir(parents=True)
    shutil.copy(mempool.library_path(), libdir / "libmempool.so.0.1.0")
    os.symlink("libmempool.so.0.1.0", libdir / "libmempool.so.0")
    os.symlink("libmempool.so.0", libdir / "libmempool.so")
    env = {k: v for k, v in os.environ.items() if k != "MEMPOOL_LIBRARY"}
    env.update(PYTHONPATH=str(target), LD_LIBRARY_PATH=str(libdir))
    code = "import mempool\nprint(mempool.library_path())\n" + USE
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path, allocated = r.stdout.split()
    assert path == str(libdir / "libmempool.so.0"), path
    assert allocated == "1"
    # What library_path() says is a path $MEMPOOL_LIBRARY takes.
    env = dict(env, MEMPOOL_LIBRARY=path)
    env.pop("LD_LIBRARY_PATH")
    r = subprocess.run([sys.executable, "-c", "import mempool\n" + USE], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "1"
