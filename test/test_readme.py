"""The README's examples run as written: every ```python block (in order, one namespace; a block
right after a `<!-- not run: why -->` line is left out, with its reason) on the CPU, and the
`ae-opt` block's commands in a shell, whose outputs must hold what its comments promise (wgmma
in the PTX, v_mfma in the AMDGCN, the pipeline's passes)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


def _blocks(language: str) -> list[tuple[int, str, str]]:
    """(line, source, reason not run or "") of each fenced block of `language` in the README."""
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = f.read().split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == f"```{language}":
            start = i
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            skipped = NOT_RUN.match(lines[start - 1].strip()) if start else None
            found.append((start + 1, "\n".join(body), skipped.group(1) if skipped else ""))
        i += 1
    return found


def test_the_python_examples_run(capsys):
    blocks = _blocks("python")
    assert len(blocks) >= 3
    namespace = {"__name__": "readme"}
    ran = 0
    for line, source, reason in blocks:
        if reason:
            continue
        exec(compile(source, f"README.md:{line}", "exec"), namespace)
        ran += 1
    assert ran >= 2
    assert '"attn.score"' in capsys.readouterr().out  # the first example prints its L0 module
    bias = namespace["bias"]
    assert bias.grad is not None and bias.grad.abs().sum() > 0
    assert all(namespace[name].grad is not None for name in ("q", "k", "v"))


def test_every_block_left_out_says_why():
    assert all(not reason or len(reason.split()) >= 2 for _, _, reason in _blocks("python"))


def test_the_ae_opt_commands_run(tmp_path):
    (source,) = [s for _, s, _ in _blocks("sh") if "ae-opt causal.mlir" in s]
    commands = re.sub(r"\\\n\s*", "", source).strip().split("\n")
    outputs = {}
    for command in commands:
        command = command.split("  #")[0].strip()
        if command.startswith("python -c"):
            command = shlex.quote(sys.executable) + command[len("python"):]
        done = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
                                       + os.environ.get("PATH", "")))
        assert done.returncode == 0, (command, done.stderr[-2000:])
        outputs[command] = done.stdout + done.stderr  # --dump-pass-pipeline writes to stderr, as mlir-opt does
    by_flag = {flag: next(out for command, out in outputs.items() if flag in command)
               for flag in ("--pass-pipeline", "--emit=ptx", "--emit=amdgcn", "--dump-pass-pipeline", "--list-passes",
                            "--pipeline=cpu", "assume-aligned=false")}
    assert "scf.for" in by_flag["--pass-pipeline"] and "attn.grid" in by_flag["--pass-pipeline"]
    assert "wgmma" in by_flag["--emit=ptx"]
    assert "v_mfma" in by_flag["--emit=amdgcn"]
    assert "attn-tile" in by_flag["--dump-pass-pipeline"] and "attn-tile" in by_flag["--list-passes"]
    assert "llvm.func" in by_flag["--pipeline=cpu"]
    # The general variant: i64 strides and no alignment assumed.
    general = by_flag["assume-aligned=false"]
    assert "tt.func" in general and "attn.assume_aligned = false" in general

