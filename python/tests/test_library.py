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


def test_without_env_the_build_tree_library_is_found():
    import glob
    import pytest
    repo = os.path.dirname(PKG)
    if not glob.glob(os.path.join(repo, "build*", "src", "libmempool.so")):
        pytest.skip("no build tree inside this checkout")
    env = {k: v for k, v in os.environ.items() if k != "MEMPOOL_LIBRARY"}
    r = subprocess.run([sys.executable, "-c", "import mempool; print(mempool.find_library())"],
                       cwd=PKG, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    found = r.stdout.strip()
    # The checkout's build*/src/libmempool.so is chosen before the system's.
    assert found.startswith(repo + os.sep) and found.endswith(
        os.path.join("src", "libmempool.so")), found


def test_a_library_next_to_the_package_comes_before_the_build_tree(tmp_path):
    import shutil
    pkg = tmp_path / "mempool"
    shutil.copytree(os.path.join(PKG, "mempool"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(mempool.library_path(), pkg / "libmempool.so")
    env = {k: v for k, v in os.environ.items() if k != "MEMPOOL_LIBRARY"}
    r = subprocess.run([sys.executable, "-c", "import mempool; print(mempool.find_library())"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pkg / "libmempool.so")


def test_a_library_that_is_not_libmempool_is_a_clear_error():
    # A stale or foreign .so (here libm) loaded, then the first missing
    # function raised AttributeError from inside the package, on every call.
    import ctypes
    import ctypes.util
    ctypes.CDLL(ctypes.util.find_library("m"))  # mapped now, if not before
    with open("/proc/self/maps") as f:
        libm = next(line.split()[-1] for line in f if "/libm." in line)
    r = _run("import mempool\n"
             "for _ in range(2):\n"
             "  try:\n"
             "    mempool.Device('host')\n"
             "  except mempool.LibraryNotFound as e:\n"
             "    print('LNF', e)\n", {"MEMPOOL_LIBRARY": libm})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and all(l.startswith("LNF") for l in lines), r.stdout
    assert libm in lines[0] and "mp_status_string" in lines[0]


def test_another_thread_never_sees_the_library_without_its_path(monkeypatch):
    # lib() stored _lib, then _path: a thread switch between the two let
    # another thread's library_path() (mempool.torch.use()'s) return None.
    # What another thread would see is sampled before each bytecode of a
    # first load.
    import sys
    from mempool import _lib
    path = _lib.library_path()
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "_path", None)
    seen = []

    def step(frame, event, arg):
        if event == "opcode":
            seen.append((_lib._lib is not None, _lib._path))
        return step

    def enter(frame, event, arg):
        if frame.f_code is _lib.lib.__code__:
            frame.f_trace_opcodes = True
            return step
        return None

    sys.settrace(enter)
    try:
        _lib.lib()
    finally:
        sys.settrace(None)
    assert seen and seen[-1] == (True, path)
    assert all(p == path for loaded, p in seen if loaded), seen


def test_a_relative_env_path_loads_that_file_and_names_it_in_full(tmp_path):
    # MEMPOOL_LIBRARY=libmempool.so (a file in the working directory) was
    # found as a file there, then handed to dlopen as a bare name, which
    # searches the loader's path and not the working directory: the load
    # failed, or took another libmempool.so than the one named. A relative
    # path (./x.so) loaded, but library_path() gave it relative, wrong for
    # mempool.torch.use() once the process changed directory.
    import shutil
    shutil.copy(mempool.library_path(), tmp_path / "libmempool.so")
    env = dict(os.environ, PYTHONPATH=PKG)
    env.pop("LD_LIBRARY_PATH", None)
    for name in ["libmempool.so", os.path.join(".", "libmempool.so")]:
        env["MEMPOOL_LIBRARY"] = name
        r = subprocess.run([sys.executable, "-c",
                            "import mempool; mempool.Device('host').close(); "
                            "print(mempool.library_path())"],
                           cwd=str(tmp_path), env=env, capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)
        assert r.stdout.strip() == str(tmp_path / "libmempool.so"), name
