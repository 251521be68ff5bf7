"""`mmpe list | head`: a reader that leaves early gets no BrokenPipeError traceback."""

import subprocess
import sys


def test_closed_pipe_is_quiet():
    proc = subprocess.Popen([sys.executable, "-m", "mmpe.cli", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before mmpe writes a line
    _, err = proc.communicate(timeout=120)
    assert b"BrokenPipeError" not in err and b"Traceback" not in err, err.decode()[-2000:]
    assert proc.returncode == 0
