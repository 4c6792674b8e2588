# ae-opt runs without importing torch or triton.
# RUN: %PYTHON %s %S/../dialect/roundtrip.mlir | FileCheck %s
import sys

from ae_mlir import cli

status = cli.main([sys.argv[1], "--attn-verify", "-o", "/dev/null"])
print("status:", status)
print("heavy imports:", sorted({m.split(".")[0] for m in sys.modules} & {"torch", "triton"}))
# CHECK: status: 0
# CHECK-NEXT: heavy imports: []
