"""The integrations' libraries stay optional: ``import sol_ext`` (and the modules the core uses) loads
neither Lightning nor transformers; only ``sol_ext.lightning`` / ``sol_ext.hf`` do."""
import subprocess
import sys

OPTIONAL = ("lightning", "pytorch_lightning", "transformers", "accelerate")


def test_importing_sol_ext_imports_no_integration_library():
    code = ("import sys, sol_ext, sol_ext.distributed, sol_ext.head, sol_ext.metrics\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
