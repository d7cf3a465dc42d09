"""The approval consumer: a run of one pause, asked for by a service outside this process.

A service that runs its own code asks the team a question (``POST /api/approvals``): the run's
first step pauses with the service's message and data, and waits in the team's inbox like any
other pause (the team's rules, notifications, deadlines and audit); an approval completes the
run with the answer as its output, a rejection ends it ``rejected``. What was asked is stored
in the run's driver state: the message and data, the JSON Schema the answer must fit, and what
the pause asks of its policy. Nothing here runs the service's code: it waits for the answer
(``Prefer: wait``, polling, or the ``run.finished`` webhook).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from actions import engine
from actions.engine.driving import Answers, Driver, Pause, StepResult, call_binding
from actions.engine.errors import MAX_ERROR_CHARS, InvalidInput
from actions.engine.policies import effective_policy
from actions.engine.schemas import check_answer_schema, field_error, schema_errors
from actions.models import Membership, Run, Team

APPROVAL_ACTION = "approval"
# A question is short: a page's heading, a mail's subject, a Slack message's first line.
MAX_MESSAGE_CHARS = MAX_ERROR_CHARS
MAX_DEADLINE = timedelta(days=30)
MAX_APPROVALS = 10
# A default answer approves when the deadline passes: the team gets this long to object.
MIN_DEFAULT_SECONDS = 600


def request_approval(
    team: Team,
    by: Any,
    *,
    message: str,
    data: Any = None,
    answer_schema: dict[str, Any] | None = None,
    deadline_seconds: int | None = None,
    default_answer: Any = None,
    approvals_required: int | None = None,
    assignees: list[str] | None = None,
) -> Run:
    """Queue a run whose one pause asks the team ``message``. Raises InvalidInput (nothing
    queued) when what is asked cannot be asked: a schema that is not JSON Schema, a default
    answer that does not fit it, assignees who are not in the team."""
    message = message.strip()
    if not message:
        raise InvalidInput("message must not be empty", [field_error("message", "must not be empty")])
    if answer_schema is not None:
        check_answer_schema(answer_schema)
    if default_answer is not None:
        if deadline_seconds is None:
            raise InvalidInput(
                "default_answer applies when the deadline passes: give deadline_seconds too",
                [field_error("default_answer", "needs deadline_seconds")],
            )
        if deadline_seconds < MIN_DEFAULT_SECONDS:
            raise InvalidInput(
                f"a default answer approves without a person: give the team at least {MIN_DEFAULT_SECONDS}"
                " seconds to object (deadline_seconds)",
                [field_error("deadline_seconds", f"at least {MIN_DEFAULT_SECONDS} with a default_answer")],
            )
        if answer_schema is not None and (errors := schema_errors(answer_schema, default_answer)):
            raise InvalidInput(
                "default_answer does not fit answer_schema",
                [{**error, "loc": ["default_answer", *error["loc"]]} for error in errors],
            )
    names = list(dict.fromkeys(name.strip() for name in assignees or [] if name.strip()))
    if names:
        members = Membership.who_decide(team, names)
        if missing := [name for name in names if name not in members]:
            raise InvalidInput(
                f"assignees must be members of {team} who decide (approvers or admins):"
                f" {', '.join(missing)} is not",
                [field_error("assignees", f"not an approver or admin of the team: {', '.join(missing)}")],
            )
    check_against_team(team, names, approvals_required, default_answer)
    policy: dict[str, Any] = {}
    if deadline_seconds is not None:
        policy["deadline_seconds"] = deadline_seconds
        policy["default_answer"] = default_answer
    if approvals_required is not None:
        policy["approvals"] = approvals_required
    if names:
        policy["assignees"] = names
    state = {"message": message, "data": data, "answer_schema": answer_schema, "policy": policy}
    return engine.start_run(
        APPROVAL_ACTION,
        {"message": message, "data": data},
        team,
        by,
        Run.Consumer.APPROVAL,
        driver_state=state,
        here=True,  # its step only records the question: the caller gets its interrupt at once
    )


def check_against_team(
    team: Team, assignees: list[str], approvals_required: int | None, default_answer: Any
) -> None:
    """What a request asks of its policy adds to the team's (admin: Policies, for the action
    ``approval``), never takes from it: assignees among the team's own, if it names any; a
    default answer only where the team lets one approval, by anyone, settle it, and says no
    default of its own; no more approvals than there are people to give them."""
    team_policy = effective_policy(team.pk, APPROVAL_ACTION)
    if team_policy.assignees and not set(assignees) <= set(team_policy.assignees):
        allowed = ", ".join(team_policy.assignees)
        raise InvalidInput(
            f"the team's policy lets only {allowed} decide approvals: assignees must be among them",
            [field_error("assignees", f"not among {allowed}")],
        )
    if default_answer is not None:
        why = ""
        if team_policy.deadline is not None:
            why = "the team's policy says what happens at the deadline"
        elif team_policy.approvals > 1 or team_policy.assignees or assignees:
            why = "the team's policy (or this request) gives it to named or several people"
        elif (approvals_required or 1) > 1:
            why = "it needs several people's approval"
        elif not team_policy.auto_approve:
            why = "the team's policy lets no approval be given automatically"
        if why:
            raise InvalidInput(
                f"default_answer cannot approve it at the deadline: {why}",
                [field_error("default_answer", why)],
            )
    needed = max(team_policy.approvals, approvals_required or 1)
    people = assignees or list(team_policy.assignees)
    if people and needed > len(people):
        raise InvalidInput(
            f"{needed} approvals are needed and only {len(people)} people may give them",
            [field_error("approvals_required", f"more than the {len(people)} assignees")],
        )


def policy_of(state: dict[str, Any]) -> dict[str, Any]:
    """What the request asks of the pause's policy, as ApprovalPolicy's fields. Whoever asks
    for an approval may not approve it (a service is not a reviewer), whatever else it asks."""
    asked = state.get("policy") or {}
    policy: dict[str, Any] = {"requester_may_approve": False}
    if "deadline_seconds" in asked:
        policy["deadline"] = timedelta(seconds=asked["deadline_seconds"])
        policy["default_answer"] = asked.get("default_answer")
    if "approvals" in asked:
        policy["approvals"] = asked["approvals"]
    if asked.get("assignees"):
        policy["assignees"] = tuple(asked["assignees"])
    return policy


class ApprovalDriver(Driver):
    """Pauses once; an approval completes the run with the answer as its output."""

    def step(self, run: Run, answers: Answers) -> StepResult:
        binding = call_binding(APPROVAL_ACTION)
        answer = answers.for_call(binding)
        if answer is not None and answer.approved:
            return StepResult(Run.Status.COMPLETED, output=answer.data)
        state = run.driver_state
        pause = Pause(
            state["message"],
            state.get("data"),
            None,
            action=APPROVAL_ACTION,
            binding=binding,
            # What rules read as ``input`` and a standing grant is scoped to: the whole question
            # (a grant given for one question approves no other with the same data).
            arguments={key: state.get(key) for key in ("message", "data", "answer_schema")},
            answer_schema=state.get("answer_schema"),
            policy=policy_of(state),
        )
        return StepResult(Run.Status.INTERRUPTED, pauses=[pause])
