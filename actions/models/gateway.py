"""The MCP gateway's tables: the upstream MCP servers a team puts its approvals in front of, the
calls made through them, and the keys approval receipts are signed with."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

from actions.models.runs import Run
from actions.models.teams import ApiToken, Team

# A name is part of a URL (/mcp/gateway/<name>/) and of the action a rule names (<name>/<tool>).
UPSTREAM_NAME = RegexValidator(
    r"^[a-z0-9](?:[a-z0-9-]{0,48}[a-z0-9])?$",
    "a name is lower-case letters, digits and hyphens (1 to 50), not starting or ending with a hyphen",
)


class McpUpstream(models.Model):
    """An MCP server (Streamable HTTP) whose tools the team's agent hosts call through the
    gateway: each call is decided as the tool's policy says before it reaches the server."""

    class Policy(models.TextChoices):
        # Every call waits for a person; no rule or grant approves it (a rule may still reject).
        ASK = "ask", "always ask"
        # The team's rules and grants decide, then people: as any action's pause.
        RULES = "rules", "rules decide"
        # Approved at once, after the team's rules (one that rejects or routes still does).
        NEVER = "never", "never ask"

    team = models.ForeignKey(Team, models.CASCADE, related_name="mcp_upstreams", db_index=False)
    name = models.CharField(max_length=50, validators=[UPSTREAM_NAME])
    url = models.URLField(max_length=2000)
    # The headers sent with every request to it (its credentials), as JSON, sealed
    # (actions.engine.sealed): never shown again, never in a page, the API or the log.
    headers_sealed = models.TextField(blank=True)
    header_names = models.JSONField(default=list, blank=True)  # what may be shown: the names
    default_policy = models.CharField(max_length=10, choices=Policy.choices, default=Policy.RULES)
    tool_policies = models.JSONField(default=dict, blank=True)  # tool name -> Policy
    # Its tools/list, as it last said it (the gateway serves this), and when.
    tools = models.JSONField(default=list, blank=True)
    tools_fetched_at = models.DateTimeField(null=True, blank=True)
    tools_error = models.TextField(blank=True)
    created_by_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="mcp_upstream_team_name")]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}"

    def policy_for(self, tool: str) -> str:
        return str(self.tool_policies.get(tool) or self.default_policy)

    def tool(self, name: str) -> dict[str, Any] | None:
        return next((tool for tool in self.tools if tool.get("name") == name), None)


class GatewayCall(models.Model):
    """One ``tools/call`` through the gateway: the run that decides it and makes it. A host that
    sends the same call again before it has been given the result joins this one."""

    run = models.OneToOneField(Run, models.CASCADE, primary_key=True, related_name="gateway_call")
    upstream = models.ForeignKey(
        McpUpstream, models.SET_NULL, null=True, related_name="calls", db_index=False
    )
    token = models.ForeignKey(ApiToken, models.SET_NULL, null=True, related_name="+", db_index=False)
    tool = models.CharField(max_length=200)
    arguments_sha256 = models.CharField(max_length=64)
    # The host has been given the call's final result: the same call sent after that is a new one.
    delivered = models.BooleanField(default=False)
    # When the upstream was called: set once, before the call, by one conditional UPDATE, so
    # that a step run again (a worker lost mid-call) never calls it twice.
    called_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(
                fields=["token", "upstream", "tool", "arguments_sha256"],
                condition=models.Q(delivered=False),
                name="gateway_call_undelivered",
            )
        ]


class ReceiptKey(models.Model):
    """An Ed25519 key that signs approval receipts (actions.engine.receipts.signing_key says
    which). Retired ones stay published (/.well-known/jwks.json) until the receipts they signed
    have expired; revoked ones are withdrawn at once."""

    kid = models.CharField(max_length=64, unique=True)
    private_sealed = models.TextField()
    public_jwk = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return self.kid

    @property
    def published(self) -> bool:
        """In /.well-known/jwks.json: not revoked, and not retired longer ago than a receipt
        lives (a retirement may be in the future: the key signs until then)."""
        if self.revoked_at is not None:
            return False
        if self.retired_at is None:
            return True
        lifetime = settings.GRUNDLAG_RECEIPT_SECONDS
        return (timezone.now() - self.retired_at).total_seconds() < lifetime
