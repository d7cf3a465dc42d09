from __future__ import annotations

from django.urls import path

from actions.web import bulk, gateway, grants, history, links, runs, slack, teams, views

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("interrupts/<int:pk>/", views.interrupt_detail, name="interrupt"),
    path("interrupts/<int:pk>/approve/", views.approve, name="approve"),
    path("interrupts/<int:pk>/reject/", views.reject, name="reject"),
    path("interrupts/<int:pk>/comments/", views.comments, name="comments"),
    path("bulk/", bulk.bulk, name="bulk"),
    path("runs/", runs.runs, name="runs"),
    path("runs/<int:pk>/", runs.run_detail, name="run"),
    path("runs/<int:pk>/cancel/", runs.cancel_run, name="cancel_run"),
    path("start/", runs.start, name="start"),
    path("start/<str:name>/", runs.start_action, name="start_action"),
    path("history/", history.history, name="history"),
    path("history/export.<str:fmt>", history.export_interrupts, name="history_export"),
    path("history/events.<str:fmt>", history.export_events, name="history_events"),
    path("settings/notifications/", runs.preferences, name="notification-preferences"),
    path("grants/", grants.grants, name="grants"),
    path("grants/<int:pk>/revoke/", grants.revoke, name="revoke-grant"),
    path("teams/", teams.teams, name="teams"),
    path("teams/<slug:slug>/", teams.team, name="team"),
    path("teams/<slug:slug>/members/", teams.set_member, name="team-member"),
    path("teams/<slug:slug>/members/<int:user_id>/remove/", teams.remove_member, name="team-member-remove"),
    path("teams/<slug:slug>/tokens/", teams.create_token, name="team-token"),
    path("teams/<slug:slug>/tokens/<int:token_id>/revoke/", teams.revoke_token, name="team-token-revoke"),
    path("teams/<slug:slug>/gateway/", gateway.add_upstream, name="team-upstream-add"),
    path("teams/<slug:slug>/gateway/<slug:name>/", gateway.upstream_page, name="team-upstream"),
    path(
        "teams/<slug:slug>/gateway/<slug:name>/policies/", gateway.set_policies, name="team-upstream-policies"
    ),
    path(
        "teams/<slug:slug>/gateway/<slug:name>/refresh/",
        gateway.refresh_upstream,
        name="team-upstream-refresh",
    ),
    path(
        "teams/<slug:slug>/gateway/<slug:name>/remove/", gateway.remove_upstream, name="team-upstream-remove"
    ),
    path("settings/away/", grants.away, name="away"),
    path("settings/away/<int:pk>/back/", grants.back, name="away-back"),
    # A mail's personal decision link, and Slack's interactions (signed by Slack, not a session).
    path("d/<str:token>/", links.decision_link, name="decision-link"),
    path("slack/interactions", slack.interactions, name="slack-interactions"),
]
