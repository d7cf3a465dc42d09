"""The engine: every state change of a run or an interrupt.

Views, the API, consumers, tasks and management commands call the functions exported here;
none of them changes a status itself. Each change is one conditional UPDATE (or a row lock
followed by one), so concurrent callers get exactly one winner, and slow work (running a step,
pushing to browsers) happens after commit.

- ``steps``: starting runs, handing steps to workers (or running them inline), recording them;
- ``decisions``: approving, rejecting, N-of-M approvals, cancelling;
- ``policies``: what an interrupt's policy says, and who may decide it;
- ``deadlines``: a policy's timers (deadlines, escalations);
- ``recovery``: steps whose worker died, messages that were lost;
- ``journal``: the transaction's audit events, its inbox changes (numbered in each team's
  stream) and its pushes after commit;
- ``store``: every SQL statement written by hand;
- ``errors``: what the engine refuses, and the limits on what it stores.
"""

from __future__ import annotations

from actions.engine.comments import comment, may_comment
from actions.engine.deadlines import apply_policies
from actions.engine.decisions import (
    CANCELLABLE,
    Decided,
    GrantAsked,
    agreement_key,
    approve,
    cancel,
    proposed_arguments,
    reject,
    resume,
    validate_answer,
)
from actions.engine.errors import (
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
from actions.engine.journal import InboxChange, public_error
from actions.engine.journal import log as log_event
from actions.engine.policies import (
    effective_policy,
    may_decide,
    separation_of_duties,
    why_not,
    why_not_cancel,
)
from actions.engine.recovery import sweep
from actions.engine.steps import execute_step, pending_interrupts, record, start_run
from actions.engine.store import counted_approvals, snapshot

__all__ = [
    "CANCELLABLE",
    "AlreadyDecided",
    "Decided",
    "GrantAsked",
    "Busy",
    "EngineError",
    "InboxChange",
    "InvalidAnswer",
    "InvalidInput",
    "NotAllowed",
    "NotCancellable",
    "PayloadTooLarge",
    "agreement_key",
    "approve",
    "apply_policies",
    "cancel",
    "check_size",
    "counted_approvals",
    "effective_policy",
    "execute_step",
    "log_event",
    "comment",
    "may_comment",
    "may_decide",
    "proposed_arguments",
    "pending_interrupts",
    "public_error",
    "record",
    "reject",
    "resume",
    "separation_of_duties",
    "snapshot",
    "start_run",
    "sweep",
    "validate_answer",
    "why_not",
    "why_not_cancel",
]
