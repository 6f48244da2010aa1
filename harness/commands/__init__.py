"""The subcommands, one module each (as asv's `asv/commands/`)."""

from harness.commands.backends import Backends
from harness.commands.baseline import Baseline
from harness.commands.gate import Gate
from harness.commands.generate import Generate
from harness.commands.inspect import Inspect
from harness.commands.prefill import Prefill
from harness.commands.report import Report
from harness.commands.run import Run
from harness.commands.speculative import Speculative

COMMANDS = (Run, Backends, Inspect, Generate, Report, Gate, Baseline, Speculative, Prefill)
