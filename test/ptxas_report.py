"""What ptxas says of a kernel's PTX for sm90a: register spills, which the PTX does not show."""
from __future__ import annotations


def ptxas_spill_bytes(ptx: str) -> int:
    """The spill stores ptxas reports for sm90a (Triton's own ptxas), bytes."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        report = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(tmp, "kernel.cubin")],
                                capture_output=True, text=True, check=True).stderr
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", report))
