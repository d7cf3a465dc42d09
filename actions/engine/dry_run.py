"""A rule's dry run: what a team's rule, new or changed, would have done to the team's last
interrupts, before it is enabled (the admin's "Dry run")."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from actions.engine.rules import Compiled, call_input, compile_team, context, evaluate, requester_name
from actions.models import Interrupt, Team

# A dry run stops once its conditions may have taken this many interrupts' budgets: it answers a
# page, and says how many interrupts it looked at.
DRY_RUN_BUDGETS = 20


@dataclass(frozen=True)
class Would:
    interrupt: Interrupt
    outcome: str
    error: str = ""
    earlier: str = ""  # an earlier rule of the team that holds first

    @property
    def agrees(self) -> bool | None:
        """Whether people decided it the same way (None: not comparable)."""
        said = self.outcome.split(":", 1)[0].split(" ", 1)[0]
        if said == "approve":
            return self.interrupt.status == Interrupt.Status.APPROVED
        if said == "reject":
            return self.interrupt.status == Interrupt.Status.REJECTED
        return None


def run(team: Team, rule: Compiled, limit: int = 1000) -> tuple[int, list[Would], list[Would]]:
    """What ``rule`` (a team's, new or changed: ``order`` is where it would stand) would have
    done to the team's last ``limit`` interrupts: how many were looked at, those it holds for
    (with what it would have done), and those it failed on. An earlier enabled rule of the
    team that holds first is named."""
    teams = compile_team(team.pk, -1, team.slug)
    earlier = [
        each for each in teams.rules if each.team_rule_id != rule.team_rule_id and each.order < rule.order
    ]
    recent = (
        Interrupt.objects.filter(team=team)
        .select_related("run")
        .order_by("-created_at", "-id")
        .only(
            "id",
            "run_id",
            "seq",
            "team_id",
            "action",
            "message",
            "data",
            "arguments",
            "status",
            "decided_by_name",
            "decided_via",
            "created_at",
            "run__input",
            "run__started_by_name",
        )[:limit]
    )
    looked, held, failed = 0, [], []
    spent, most = 0, DRY_RUN_BUDGETS * settings.GRUNDLAG_CONDITION_BUDGET
    for it in recent:
        if spent > most:
            break  # the page says how many were looked at
        looked += 1
        if not rule.covers(it.action):
            continue
        given = context(
            it.data, call_input(it.run, it.arguments), it.action, team.slug, requester_name(it.run)
        )
        verdict = evaluate([rule], given, it.action)
        spent += given.spent
        if verdict.failed:
            failed.append(Would(it, "", error=verdict.error))
        elif verdict.rule is not None:
            first = evaluate(earlier, given, it.action)
            held.append(Would(it, rule.then.describe(), earlier=first.rule.name if first.rule else ""))
    return looked, held, failed
