"""nbval's kernels start one at a time across processes, with the chapters' knobs drawn as static figures.

The knobs (`labkit.book.knobs`) show sliders in JupyterLab; a widget's output names a random model id,
so under nbval they draw their figure at the default setting instead (LABKIT_KNOBS=0, inherited
by every kernel started from here), as the stored outputs do.  Chapter 6's live run (`labkit.live`) is
skipped the same way (LABKIT_LIVE=0): the tests read the committed run, and so does the book's build.


`make test` runs nbval twice side by side (native and portable kernels).  A kernel's ports are
chosen free by its parent, then bound by the kernel a moment later; two processes choosing at
the same moment can pick the same port, and the second kernel then dies before it replies
("Kernel died before replying to kernel_info").  An OS lock held from choosing the ports until
the kernel is ready closes that window; the kernel releases nothing else, and a process that
dies drops its lock.
"""

import fcntl
import os
import tempfile
from pathlib import Path

import nbval.kernel

os.environ["LABKIT_KNOBS"] = "0"
os.environ["LABKIT_LIVE"] = "0"  # chapter 6's live run reads nothing here: the tests read the committed run
_start_new_kernel = nbval.kernel.start_new_kernel
LOCK = Path(tempfile.gettempdir()) / "labkit-nbval-kernel-start.lock"


def start_new_kernel_alone(*args, **kwargs):
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_new_kernel(*args, **kwargs)


nbval.kernel.start_new_kernel = start_new_kernel_alone
