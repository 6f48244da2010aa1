"""How many CPUs this process may run on: a container's share, where os.cpu_count() is the
host's. The reference's threaded softmax and the cache checksum size their pools by it."""

import os

USABLE_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
