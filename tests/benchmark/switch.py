"""A Django management command with another GIL switch interval: ``python -m tests.benchmark.switch``.

The latency part's ``outbox-switch`` system (issue 44): whether sender threads
waiting for the GIL after a reply (up to ``sys.getswitchinterval()``, 5 ms by
default, behind a thread that computes) make the hand-over's tail. The
interval is ``BENCH_SWITCH_INTERVAL`` seconds; ``--processes`` children are
forked and keep it.
"""

import os
import sys

from django.core.management import execute_from_command_line

sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
execute_from_command_line(["manage.py", *sys.argv[1:]])
