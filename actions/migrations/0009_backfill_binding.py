"""Interrupts created before approvals were bound to their call (0007) have an empty binding,
which resumes nothing: give each the binding it would have had, so that a pause waiting (or
just answered) at the upgrade resumes as it would have before it, instead of asking again."""

import hashlib
import json

from django.db import migrations


def _hash(arguments):
    canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _agent_binding(interrupt, run):
    """The last turn whose calls include the interrupt's id: the turn it paused in."""
    turn, found = -1, None
    for message in run.driver_state.get("messages", []):
        if message.get("role") != "assistant":
            continue
        turn += 1
        for position, call in enumerate(message.get("tool_calls") or []):
            if call.get("id") == interrupt.tool_call_id:
                try:
                    arguments = json.loads(call.get("function", {}).get("arguments") or "{}")
                except ValueError:
                    continue
                found = {
                    "action": interrupt.action,
                    "turn": turn,
                    "position": position,
                    "arguments_sha256": _hash(arguments),
                }
    return found


def backfill(apps, schema_editor):
    Interrupt = apps.get_model("actions", "Interrupt")
    for interrupt in Interrupt.objects.filter(binding={}).select_related("run").iterator(chunk_size=500):
        run = interrupt.run
        binding = {"action": interrupt.action}
        if run.consumer == "agent" and interrupt.tool_call_id:
            binding = _agent_binding(interrupt, run) or binding
        elif run.consumer == "sandbox" and (paused := run.driver_state.get("paused")):
            if paused.get("action") == interrupt.action:
                binding = {
                    "action": paused["action"],
                    "position": paused["position"],
                    "arguments_sha256": _hash(paused.get("input")),
                }
        Interrupt.objects.filter(pk=interrupt.pk).update(binding=binding)


class Migration(migrations.Migration):
    dependencies = [("actions", "0008_safe_json")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
