"""The documented sizes of what crosses the wire on the private path, checked by test_netns.py
on a capture of the relay's interface once they are set (None: not documented yet, the sizes are
only listed in the test output).

REQUEST_BUCKETS: the sizes (bytes) an encapsulated request body may have.
RESPONSE_BUCKETS: the sizes a response record may have: a whole `message/ohttp-res` body, or one
chunk (AEAD ciphertext, tag included) of a `message/ohttp-chunked-res`.
"""

from __future__ import annotations

REQUEST_BUCKETS: tuple[int, ...] | None = None
RESPONSE_BUCKETS: tuple[int, ...] | None = None
