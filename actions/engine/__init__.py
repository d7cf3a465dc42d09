"""The engine: every state change of a run or an interrupt, and the reads on the path of a
pause and its decision (the API token a request names, the run a wait reads, the interrupt a
decision names: ``store``'s SQL, not the ORM's query building).

Views, the API, consumers, tasks and management commands call the functions exported here;
none of them changes a status itself. Each change is one conditional UPDATE (or a row lock
followed by one), so concurrent callers get exactly one winner, and slow work (running a step,
pushing to browsers) happens after commit.

From the top (pyproject.toml's import-linter contract holds the order):

- ``deadlines``, ``comments``, ``recovery``: a policy's timers, the discussion, steps whose
  worker died and messages that were lost;
- ``steps``: starting runs, running a step and recording how it ended;
- ``decisions``: approving, rejecting, N-of-M approvals, cancelling; a rule's or a grant's
  decision (``settle``);
- ``queue``: handing a run's next step over (to a worker, the embedded pool, or inline), the
  teams' fair shares; ``grants``: standing grants; ``dry_run``: a rule's dry run;
- ``rules``: the teams' rules (CEL), judged before the transaction, applied in it (``route``);
- ``delegation``: time away; ``policies``: what an interrupt's policy says, who may decide it;
- ``journal``: the transaction's audit events, its inbox changes (numbered in each team's
  stream) and its announcements after commit; ``audit``: the hash chains; ``idempotency``;
- ``store``: every statement the engine makes, by name; ``sql``: how they run;
- ``driving``: the driver port and registry; ``errors``: what the engine refuses, and the
  limits on what it stores.
"""

from __future__ import annotations

from actions.engine import directory, gateway, idempotency, members, outbound, receipts, sealed, tokens
from actions.engine.comments import comment, may_comment
from actions.engine.deadlines import apply_policies
from actions.engine.decisions import (
    CANCELLABLE,
    Decided,
    GrantAsked,
    agreement_key,
    approve,
    arguments_schema,
    cancel,
    proposed_arguments,
    reject,
    resume,
    validate_answer,
)
from actions.engine.delegation import end_away, set_away
from actions.engine.dry_run import run as dry_run
from actions.engine.errors import (
    DATABASE_UNAVAILABLE,
    AlreadyDecided,
    Busy,
    EngineError,
    InvalidAnswer,
    InvalidInput,
    NotAllowed,
    NotCancellable,
    PayloadTooLarge,
    check_size,
)
from actions.engine.grants import GRANT_LASTING, GrantRefused, give_grant, revoke_grant, why_no_grant
from actions.engine.journal import InboxChange, public_error
from actions.engine.journal import log as log_event
from actions.engine.policies import (
    as_requested,
    effective_policy,
    may_decide,
    separation_of_duties,
    why_not,
    why_not_cancel,
)
from actions.engine.recovery import sweep
from actions.engine.rules import Compiled as CompiledRule
from actions.engine.rules import compile as compile_condition
from actions.engine.rules import live_grants, outcome_of

# Loading steps registers its runner with the queue (queue.steps_run_by): the queue hands runs
# over through it. tests/test_engine.py checks it is registered.
from actions.engine.steps import execute_step, pending_interrupts, record, start_run
from actions.engine.store import (
    authenticate,
    counted_approvals,
    events_to_tell,
    fanned_out,
    people,
    read_interrupt,
    read_run,
    read_run_of_team,
    read_team,
    run_interrupts,
    snapshot,
    team_channels,
    team_run,
    visible_interrupt,
    waiting_on,
    webhooks_of,
)

__all__ = [
    "AlreadyDecided",
    "Busy",
    "CANCELLABLE",
    "CompiledRule",
    "DATABASE_UNAVAILABLE",
    "Decided",
    "EngineError",
    "GRANT_LASTING",
    "GrantAsked",
    "GrantRefused",
    "InboxChange",
    "InvalidAnswer",
    "InvalidInput",
    "NotAllowed",
    "NotCancellable",
    "PayloadTooLarge",
    "agreement_key",
    "arguments_schema",
    "apply_policies",
    "approve",
    "as_requested",
    "authenticate",
    "cancel",
    "check_size",
    "comment",
    "compile_condition",
    "counted_approvals",
    "directory",
    "gateway",
    "outbound",
    "receipts",
    "sealed",
    "dry_run",
    "effective_policy",
    "end_away",
    "events_to_tell",
    "execute_step",
    "fanned_out",
    "give_grant",
    "idempotency",
    "live_grants",
    "log_event",
    "may_comment",
    "may_decide",
    "members",
    "outcome_of",
    "pending_interrupts",
    "people",
    "proposed_arguments",
    "public_error",
    "read_interrupt",
    "read_run_of_team",
    "read_run",
    "read_team",
    "record",
    "reject",
    "resume",
    "revoke_grant",
    "run_interrupts",
    "separation_of_duties",
    "set_away",
    "snapshot",
    "start_run",
    "sweep",
    "team_channels",
    "team_run",
    "tokens",
    "validate_answer",
    "visible_interrupt",
    "waiting_on",
    "webhooks_of",
    "why_no_grant",
    "why_not",
    "why_not_cancel",
]
