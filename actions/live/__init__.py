"""What open pages and waiting requests hear of the engine's changes, as they are committed:
``push`` (the inboxes' and runs' pages, over Channels' groups) and ``waiting`` (an API request
with ``Prefer: wait``, woken when its run settles, in any process)."""
