"""The plain-action driver: a run of one registered action, from the API or the dashboard.

Each step runs the action from the top; a step after a pause resumes it with the answer that
was given for it. An action pauses at most once per step, so its pauses are bound by the
action's name alone (call_binding)."""

from __future__ import annotations

from actions.core import Completed, Failed, Interrupted, invoke
from actions.drivers.base import Answers, Driver, Pause, StepResult, call_binding
from actions.models import Run


class ActionDriver(Driver):
    def step(self, run: Run, answers: Answers) -> StepResult:
        binding = call_binding(run.action)
        outcome = invoke(run.action, run.input, answers.resumption_for(binding), run_id=run.pk)
        if isinstance(outcome, Completed):
            return StepResult(Run.Status.COMPLETED, output=outcome.output)
        if isinstance(outcome, Interrupted):
            pause = Pause(outcome.message, outcome.data, outcome.state, action=run.action, binding=binding)
            return StepResult(Run.Status.INTERRUPTED, pauses=[pause])
        assert isinstance(outcome, Failed)
        return StepResult(Run.Status.FAILED, error=outcome.error, internal=outcome.unexpected)
