"""Finding libmempool.so."""
import os
import subprocess
import sys

import mempool

PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code, env):
    e = dict(os.environ)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=PKG, env=e,
                          capture_output=True, text=True)


def test_loaded_library_exists():
    assert os.path.exists(mempool.library_path())


def test_env_var_wins_and_a_wrong_path_is_a_clear_error():
    r = _run("import mempool\ntry:\n  mempool.Device('host')\nexcept mempool.LibraryNotFound as e:\n"
             "  print('LNF', e)\n", {"MEMPOOL_LIBRARY": "/nonexistent/libmempool.so"})
    assert r.returncode == 0, r.stderr
    assert "LNF" in r.stdout and "MEMPOOL_LIBRARY" in r.stdout


def test_env_var_names_the_library_loaded():
    path = mempool.library_path()
    r = _run("import mempool; print(mempool.library_path())", {"MEMPOOL_LIBRARY": path})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == path
