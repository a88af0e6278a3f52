"""Helper for tests/test_distributed.py: two ranks start the peer watch; rank 1 then stops (SIGSTOP) and rank 0
waits where no Python runs for the collective (a long sleep stands in for a CUDA wait inside NCCL)."""

import os
import signal
import threading
import time

from cleanrl_utils.distributed import Ranks

ranks = Ranks.from_env()
ranks.join_process_group(cuda=False, backend="gloo", device_ids=None, timeout=float(os.environ["WATCH_TIMEOUT"]))
ranks.step = 4096
threading.Thread(target=ranks.watch_peers, args=(0.2,), daemon=True).start()
time.sleep(1.0)  # both ranks beat at least once
if ranks.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(120)
