"""The discussion of an interrupt: comments by the members of its teams, kept in the run's event
log, and pushed to everyone viewing it. ``@username`` names a member to tell (by mail, through
the notification channels: actions.notify.dispatch)."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from actions.engine.errors import InvalidInput, NotAllowed
from actions.engine.journal import atomic, discussed, log
from actions.engine.policies import role_refusal
from actions.models import Comment, Interrupt, Membership, Role, RunEvent

MENTION = re.compile(r"(?<![\w@.])@([\w.+-]+)")
# More people than this in one comment is a broadcast, not a mention.
MAX_MENTIONS = 10


def may_comment(user: AbstractBaseUser | AnonymousUser, interrupt: Interrupt) -> bool:
    """Members of its teams (the team it escalated to too) who work its inbox (viewers,
    approvers, admins: not its auditors, who only read), whoever may decide it."""
    pk = getattr(user, "pk", None)
    return pk is not None and Membership.has(pk, interrupt.team_ids, Role.WORK)


def mentioned(body: str, interrupt: Interrupt, author_pk: int) -> list[str]:
    """The members of its teams named with @username, in the order named, the author left out."""
    names = list(dict.fromkeys(match.group(1).rstrip(".") for match in MENTION.finditer(body)))
    if not names:
        return []
    found = set(
        get_user_model()
        .objects.filter(
            username__in=names,
            is_active=True,
            memberships__team__in=interrupt.team_ids,
            memberships__role__in=Role.WORK,
        )
        .distinct()
        .exclude(pk=author_pk)
        .values_list("username", flat=True)
    )
    return [name for name in names if name in found]


def comment(interrupt: Interrupt, body: str, by: AbstractBaseUser) -> Comment:
    """Add ``by``'s comment to ``interrupt``: InvalidInput for an empty or too long one,
    NotAllowed for someone outside its teams. Open before and after it is decided."""
    text = body.strip()
    if not text:
        raise InvalidInput("a comment needs some text", [{"loc": ["body"], "msg": "Write something first."}])
    if "\x00" in text:
        raise InvalidInput(
            "the comment holds a NUL character", [{"loc": ["body"], "msg": "Remove the NUL character."}]
        )
    if len(text) > Comment.MAX_LENGTH:
        msg = f"At most {Comment.MAX_LENGTH} characters (this one has {len(text)})."
        raise InvalidInput("the comment is too long", [{"loc": ["body"], "msg": msg}])
    if not may_comment(by, interrupt):
        raise NotAllowed(
            role_refusal(by, interrupt.team_ids, Role.WORK, "discuss this")
            or f"Only members of {interrupt.team} can discuss this."
        )
    author_pk = int(by.pk)
    mentions = mentioned(text, interrupt, author_pk)
    if len(mentions) > MAX_MENTIONS:
        msg = f"Mention at most {MAX_MENTIONS} people in one comment (this one names {len(mentions)})."
        raise InvalidInput("the comment mentions too many people", [{"loc": ["body"], "msg": msg}])
    with atomic():
        made = Comment.objects.create(
            interrupt=interrupt,
            author_id=author_pk,
            author_name=by.get_username(),
            body=text,
            mentions=mentions,
        )
        log(
            interrupt.run_id,
            RunEvent.Kind.COMMENTED,
            by,
            interrupt,
            comment=made.pk,
            body=text,
            mentions=mentions,
        )
        # Everyone viewing it (its page watches its run) fetches the thread again; no run
        # status changed, so nobody waiting for one is woken.
        transaction.on_commit(
            lambda: discussed.send(
                Comment, run_id=interrupt.run_id, interrupt_id=interrupt.pk, mentions=mentions
            ),
            robust=True,
        )
    return made
