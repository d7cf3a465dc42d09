"""Demo actions: used by `seed_demo`, the README and the tests."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, Field

from actions.core import ActionContext, ActionError, ActionInterrupt, ApprovalPolicy, action
from actions.drivers.sandbox import script_action


def approved(answer: Any) -> bool:
    """An answer without an explicit ``"approved": false`` counts as approval."""
    return not (isinstance(answer, dict) and answer.get("approved") is False)


class InvoiceInput(BaseModel):
    invoice_id: str = Field(min_length=1, max_length=100, description="The invoice to send")
    amount: float = Field(gt=0, description="Amount in EUR")


@action(input=InvoiceInput)
def send_invoice(ctx: ActionContext) -> dict[str, Any]:
    """Send an invoice to the customer, once a reviewer approves it."""
    if not ctx.resumption:
        raise ActionInterrupt(
            "Approve sending the invoice?",
            {"invoice_id": ctx.input.invoice_id, "amount": ctx.input.amount},
        )
    return {"sent": True, "invoice_id": ctx.input.invoice_id, "approved_by_answer": ctx.resumption.data}


class TransferInput(BaseModel):
    amount: float = Field(gt=0, description="Amount in EUR")
    to: str = Field(min_length=1, max_length=200, description="Recipient account")


SECOND_CONFIRMATION_ABOVE = 1000


# Money and irreversible deletions: whoever asked may not also approve (separation of duties).
@action(input=TransferInput, policy=ApprovalPolicy(requester_may_approve=False))
def transfer_funds(ctx: ActionContext) -> dict[str, Any]:
    """Transfer money. Above 1,000 EUR a second confirmation is required."""
    details = {"amount": ctx.input.amount, "to": ctx.input.to}
    if not ctx.resumption:
        raise ActionInterrupt(f"Approve transferring {ctx.input.amount:,.2f} EUR?", details)
    answer = ctx.resumption.data
    if not approved(answer):
        raise ActionError("transfer declined")
    checkpoint = ctx.resumption.state
    if checkpoint is None and ctx.input.amount > SECOND_CONFIRMATION_ABOVE:
        # The first answer travels in the checkpoint: the re-run starts from the top, and this
        # is how it will know that the first confirmation was already given.
        raise ActionInterrupt(
            f"Second confirmation: {ctx.input.amount:,.2f} EUR is above {SECOND_CONFIRMATION_ABOVE:,} EUR",
            {**details, "confirmation": 2},
            state={"first_answer": answer},
        )
    answers = [checkpoint["first_answer"], answer] if checkpoint else [answer]
    return {"transferred": True, "answers": answers}


class CustomerInput(BaseModel):
    customer_id: str = Field(min_length=1, max_length=100)
    requested_by: str = Field(default="", max_length=200, description="Who asked for the deletion")


class DeletionAnswer(BaseModel):
    confirm_customer_id: str = Field(description="Type the customer id to confirm")
    scope: Literal["personal_data", "everything"] = Field(
        default="personal_data", description="What to delete"
    )
    notify_customer: bool = Field(default=True, description="Email the customer when done")
    ticket: str = Field(min_length=3, max_length=50, description="Ticket that authorises this")


# No rule or standing grant may approve a deletion: a person must, every time.
@action(
    input=CustomerInput,
    answer=DeletionAnswer,
    policy=ApprovalPolicy(requester_may_approve=False, auto_approve=False),
)
def delete_customer_data(ctx: ActionContext) -> dict[str, Any]:
    """Irreversibly delete a customer's data. The reviewer must retype the customer id."""
    customer_id = ctx.input.customer_id
    if ctx.resumption and ctx.resumption.data["confirm_customer_id"] != customer_id:
        raise ActionInterrupt(
            f"The confirmation did not match. Delete data of customer {customer_id}?",
            {"customer_id": customer_id, "previous_confirmation": ctx.resumption.data["confirm_customer_id"]},
            state={"mismatches": (ctx.resumption.state or {}).get("mismatches", 0) + 1},
        )
    if not ctx.resumption:
        raise ActionInterrupt(
            f"Delete data of customer {customer_id}? This cannot be undone.",
            {"customer_id": customer_id, "requested_by": ctx.input.requested_by},
        )
    answer = ctx.resumption.data
    return {"deleted": customer_id, "scope": answer["scope"], "ticket": answer["ticket"]}


class PaymentInput(BaseModel):
    reference: str = Field(min_length=1, max_length=100, description="Bank transfer reference")
    expected_amount: float = Field(gt=0)


class PaymentSignal(BaseModel):
    received_amount: float = Field(ge=0, description="What the bank reports as received")


@action(input=PaymentInput, answer=PaymentSignal)
def await_payment(ctx: ActionContext) -> dict[str, Any]:
    """Wait for the bank's webhook (an API caller) to report the payment, then reconcile."""
    if not ctx.resumption:
        raise ActionInterrupt(
            "Waiting for the bank to confirm the payment",
            {"reference": ctx.input.reference, "expected_amount": ctx.input.expected_amount},
        )
    received = ctx.resumption.data["received_amount"]
    return {
        "reference": ctx.input.reference,
        "received": received,
        "settled": received >= ctx.input.expected_amount,
    }


class AnnouncementInput(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(default="", max_length=5000)


@action(input=AnnouncementInput)
async def publish_announcement(ctx: ActionContext) -> dict[str, Any]:
    """Publish an announcement to every customer (an async action)."""
    if not ctx.resumption:
        raise ActionInterrupt(
            "Publish this announcement to every customer?", {"title": ctx.input.title, "body": ctx.input.body}
        )
    if not approved(ctx.resumption.data):
        raise ActionError("announcement not approved")
    await asyncio.sleep(0)
    return {"published": ctx.input.title}


class LookupInput(BaseModel):
    customer_id: str = Field(min_length=1, max_length=100)


@action(input=LookupInput)
def lookup_customer(ctx: ActionContext) -> dict[str, Any]:
    """Look a customer up (read-only: never pauses)."""
    number = sum(map(ord, ctx.input.customer_id)) % 1000
    return {"customer_id": ctx.input.customer_id, "name": f"Customer {number}", "open_balance": float(number)}


class BillingInput(BaseModel):
    customer_id: str = Field(min_length=1, max_length=100)
    invoice_id: str = Field(min_length=1, max_length=100)
    amount: float = Field(gt=0)


# A script registered as an action: the API or an agent calls `bill_customer` like any action,
# and the pause of the `send_invoice` inside it reaches the inbox.
bill_customer = script_action(
    "bill_customer",
    """
customer = tools.lookup_customer(customer_id=input["customer_id"])
sent = tools.send_invoice(invoice_id=input["invoice_id"], amount=input["amount"])
return {"customer": customer["name"], "sent": sent["sent"], "invoice_id": sent["invoice_id"]}
""",
    input=BillingInput,
    description="Look the customer up, then send the invoice (a sandboxed script).",
)
