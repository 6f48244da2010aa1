"""How long a draft may be: the two bounds `statebench speculative` names in its help, in a
module of their own so that building the parser loads none of the loop or its engines."""

from __future__ import annotations

#: the most tokens a K-token graph takes here (a verify's K; the issue's cells are 4 and 8)
MAX_K = 64

#: ORT GatedDeltaNet's `state_update_capacity` is in [0, 8]
MAX_DRAFT = 8
