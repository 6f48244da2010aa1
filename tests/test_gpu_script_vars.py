"""The GPU scripts read their settings from ``STATEBENCH_*`` variables; those that run under
``set -u`` must give every such expansion a default, or a variable left unset kills the call
on the device (2026-12-07: ``${STATEBENCH_REAL_KERNEL_OPTIONS//,/ }`` in
``gpu_real_exports.sh`` ended a call's export point at once)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.sh"))
#: ``${STATEBENCH_NAME`` and what follows the name: a default operator or anything else
EXPANSION = re.compile(r"\$\{(STATEBENCH_[A-Z0-9_]+)(:?[-+?=])?")
#: an assignment in the script itself (then the name is set before it is read)
ASSIGNED = re.compile(r"(?:^|[\s;(])(?:export\s+)?(STATEBENCH_[A-Z0-9_]+)=", re.M)


def unguarded(text: str) -> list[str]:
    """The ``STATEBENCH_*`` names ``text`` expands without a default and never assigns."""
    set_here = set(ASSIGNED.findall(text))
    return sorted({name for name, op in EXPANSION.findall(text)
                   if not op and name not in set_here})


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_set_u_scripts_give_every_setting_a_default(script):
    text = script.read_text()
    if not re.search(r"^set -\w*u", text, re.M):
        pytest.skip("not run under set -u")
    assert unguarded(text) == [], f"{script.name}: unset would end the call"


def test_the_check_finds_the_bug_it_was_written_for():
    bad = 'set -uo pipefail\nfor kv in ${STATEBENCH_REAL_KERNEL_OPTIONS//,/ }; do :; done\n'
    assert unguarded(bad) == ["STATEBENCH_REAL_KERNEL_OPTIONS"]
    fixed = 'x=${STATEBENCH_REAL_KERNEL_OPTIONS:-}\ny=${STATEBENCH_A-b} ${STATEBENCH_B:+c}\n'
    assert unguarded(fixed) == []
    assert unguarded("STATEBENCH_C=1\necho ${STATEBENCH_C}\n") == []
