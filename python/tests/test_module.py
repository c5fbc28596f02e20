"""Import-time behaviour: header parsing, library lookup, errors outside gwrun."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import HEADER, LIB, REPO, env, run

sys.path.insert(0, os.path.join(REPO, "python"))
from gradwire import _header  # noqa: E402  (no library needed)


def test_parser_reads_values_comments_and_implicit_numbers():
    enums, defines = _header.parse(textwrap.dedent("""
        #define GW_X 12
        #define GW_Y 0x10
        /* typedef enum { fake = 9 } not_this; */
        typedef enum {
          /** doc, with = and , inside */
          aNeg = -1,
          aZero = 0,   // trailing
          aOne,
          aTen = 10,
          aEleven,
        } a_t;
        typedef enum { bOnly } b_t;
        """))
    assert enums == {"a_t": {"aNeg": -1, "aZero": 0, "aOne": 1, "aTen": 10, "aEleven": 11}, "b_t": {"bOnly": 0}}
    assert defines["GW_X"] == 12 and defines["GW_Y"] == 16


def test_real_header_has_the_abi_enums():
    enums, defines = _header.load(HEADER)
    assert enums["gwResult_t"]["gwSuccess"] == 0 and len(enums["gwResult_t"]) >= 8
    assert enums["gwDataType_t"]["gwFloat64"] == 6
    assert enums["gwRedOp_t"]["gwAvg"] == 4
    assert defines["GW_UNIQUE_ID_BYTES"] == 128


def test_header_without_enums_fails_clearly(tmp_path):
    h = tmp_path / "gradwire.h"
    h.write_text("typedef enum { gwSum = 0 } gwRedOp_t;\n")
    with pytest.raises(ImportError, match="gwResult_t"):
        _header.load(str(h))


def _import(extra, code="import gradwire; print(gradwire.LIBRARY_PATH); print(gradwire.HEADER_PATH)"):
    return run([sys.executable, "-c", code], **extra)


def test_enums_and_error_classes_come_from_the_header():
    code = textwrap.dedent("""
        import gradwire, numpy as np
        from gradwire import _header
        enums, _ = _header.load(gradwire.HEADER_PATH)
        for name, v in enums["gwResult_t"].items():
            if v:
                cls = gradwire.error_class(v)
                assert cls.code == v and cls.code_name == name and issubclass(cls, gradwire.GradwireError)
                assert gradwire.error_class(name) is cls
        assert {k: v for k, v in gradwire.OPS.items()} == {k[2:].lower(): v for k, v in enums["gwRedOp_t"].items()}
        want = {"uint8": 0, "int32": 1, "int64": 2, "float16": 3, "float32": 5, "float64": 6}
        for n, v in want.items():
            assert gradwire.DTYPES[np.dtype(n)] == v
        try:
            import ml_dtypes
        except ImportError:
            assert len(gradwire.DTYPES) == 6
        else:
            assert gradwire.DTYPES[np.dtype(ml_dtypes.bfloat16)] == 4
        assert gradwire.version() > 0
        print("ok")
    """)
    p = _import({}, code)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_library_found_in_repo_without_env_vars():
    p = _import({"GRADWIRE_LIB": "", "GRADWIRE_HEADER": ""})
    assert p.returncode == 0, p.stderr
    lib, header = p.stdout.split()
    assert os.path.basename(lib) == "libgradwire.so" and os.path.isfile(lib)
    assert os.path.samefile(header, HEADER)


IMPORT = "try:\n    import gradwire\nexcept ImportError as e:\n    print('ImportError:', e)\n"


def test_bad_library_path_is_a_clear_import_error():
    p = _import({"GRADWIRE_LIB": "/nonexistent/libgradwire.so"}, IMPORT)
    assert p.stdout.startswith("ImportError:"), p.stdout + p.stderr
    assert "GRADWIRE_LIB=/nonexistent/libgradwire.so" in p.stdout, p.stdout


def test_missing_header_is_a_clear_import_error():
    p = _import({"GRADWIRE_HEADER": "/nonexistent/gradwire.h"}, IMPORT)
    assert p.stdout.startswith("ImportError:"), p.stdout + p.stderr
    assert "gradwire.h" in p.stdout and "/nonexistent/gradwire.h" in p.stdout, p.stdout


def test_library_not_found_anywhere_lists_what_was_tried(tmp_path):
    """A copy of the package outside the repository, with no library beside it."""
    import shutil
    pkg = tmp_path / "gradwire"
    shutil.copytree(os.path.join(REPO, "python", "gradwire"), pkg,
                    ignore=shutil.ignore_patterns("libgradwire.so", "_build_info.json", "__pycache__"))
    p = subprocess.run([sys.executable, "-c", IMPORT], cwd=tmp_path, capture_output=True, text=True,
                       env=env(GRADWIRE_LIB="", PYTHONPATH=str(tmp_path), LD_LIBRARY_PATH=""))
    assert p.stdout.startswith("ImportError:"), p.stdout + p.stderr
    assert "cannot load libgradwire.so" in p.stdout and str(pkg) in p.stdout and "system loader" in p.stdout, p.stdout


def test_init_outside_gwrun_raises_with_c_message():
    code = textwrap.dedent("""
        import gradwire
        try:
            gradwire.init()
        except gradwire.GradwireError as e:
            print(e.code_name, "|", e.message)
    """)
    p = _import({}, code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("gw") and "GW_RANK" in p.stdout, p.stdout
    assert os.path.isfile(LIB)


def test_installed_package_finds_header_and_library():
    """After `pip install ./python` (scripts/python-deps.sh): import from outside the
    repository, without any GRADWIRE_* variable or PYTHONPATH."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("GW_", "GRADWIRE_")) and k != "PYTHONPATH"}
    code = "import gradwire; print(gradwire.__file__); print(gradwire.HEADER_PATH); print(gradwire.version())"
    p = subprocess.run([sys.executable, "-c", code], cwd="/", env=e, capture_output=True, text=True)
    if "No module named 'gradwire'" in p.stderr:
        pytest.skip("gradwire is not pip-installed (run scripts/python-deps.sh)")
    assert p.returncode == 0, p.stderr
    pkg_file, header, version = p.stdout.split()
    assert not pkg_file.startswith(os.path.join(REPO, "python") + os.sep), pkg_file
    assert os.path.dirname(header) == os.path.dirname(pkg_file) and int(version) > 0
