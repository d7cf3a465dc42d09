"""What the pages, the HTTP API, MCP and the notifications read and say of runs and
interrupts, in one place: ``records`` (a run's and an interrupt's fields as the API and the
webhooks give them) and ``history`` (the audit history's queries)."""
