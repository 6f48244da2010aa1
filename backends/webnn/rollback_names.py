"""What a deferred-commit graph's page feeds it by name, shared by the WebNN library's rewrite
of a real export (``deferred_commit``) and statebench's own deferred export
(``model.rollback_feeds``), so both graphs take the same inputs and pairs: the accepted count
input, the capsule pairs, and the tokens a capsule holds at most."""

from __future__ import annotations

#: the input saying how many of the last verify's K tokens were kept (int64 [1])
ACCEPTED = "accepted_count"
#: the tokens a verify's capsule holds at most: ORT GatedDeltaNet's state_update_capacity
#: bound (kernels.gdn_capsule.MAX_CAPACITY)
MAX_TOKENS = 8


def capsule_name(i: int) -> tuple[str, str]:
    """Layer ``i``'s capsule pair (past, present)."""
    return f"past_state_update.{i}", f"present_state_update.{i}"
