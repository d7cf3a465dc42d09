"""A run's and an interrupt's fields as the HTTP API, MCP and the webhooks give them."""

from __future__ import annotations

from typing import Any

from actions.models import Interrupt, Run

# What an interrupt's contract is read from (Requires), its teams' slugs joined.
REQUIRES_FIELDS = (
    "team__slug",
    "approvals_required",
    "assignees",
    "requester_may_approve",
    "expires_at",
    "default_answer",
    "escalate_to__slug",
    "escalate_at",
    "escalated_at",
)


def requires_out(it: Interrupt, viewer: int) -> dict[str, Any]:
    """The interrupt's decision contract (Requires), from the fields it was created with, as
    the token of team ``viewer`` may see it: routed to another team (by a rule of its own), who
    there may decide it and where it escalates are that team's."""
    deadline = it.expires_at
    at_deadline = "default_answer" if it.default_answer is not None else "expires"
    theirs = viewer not in it.team_ids
    return {
        "team": it.team.slug,
        "approvals": it.approvals_required,
        "assignees": [] if theirs else list(it.assignees or []),
        "requester_may_approve": it.requester_may_approve,
        "deadline": deadline,
        "at_deadline": None if deadline is None else at_deadline,
        "escalate_to": it.escalate_to.slug if not theirs and it.escalate_to_id and it.escalate_to else None,
        "escalate_at": None if theirs else it.escalate_at,
    }


def run_fields(run: Run) -> dict[str, Any]:
    """What every description of a run says (the API's responses, the webhooks' bodies)."""
    return {
        "id": run.pk,
        "action": run.action,
        "consumer": run.consumer,
        "status": run.status,
        "output": run.output,
        "error": run.error,
    }


def transcript_entry(it: Interrupt) -> dict[str, Any]:
    return {
        "id": it.pk,
        "seq": it.seq,
        "message": it.message,
        "data": it.data,
        "call": it.binding or None,
        "status": it.status,
        "answer": it.answer,
        "edited_arguments": it.edited_arguments,
        "reason": it.reason,
        "decided_by": it.decided_by_name or None,
        "decided_at": it.decided_at,
        "created_at": it.created_at,
        "approvals": [
            {
                "by": approval.user.get_username(),
                "answer": approval.answer,
                "at": approval.at,
                "counted": approval.superseded_at is None,
            }
            for approval in sorted(it.approvals.all(), key=lambda approval: (approval.at, approval.pk))
        ]
        if it.approvals_required > 1
        else [],
    }
