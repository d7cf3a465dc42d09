from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from actions import engine
from actions.drivers import gateway as gateway_driver
from actions.models import McpUpstream, Team


class Command(BaseCommand):
    help = (
        "Put a team's approvals in front of an MCP server (add), list a team's, ask one for its"
        " tools again (refresh), set a tool's policy (policy), or remove one. Its tools are served"
        " at /mcp/gateway/NAME/ to agent hosts with a token of the team's."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True)
        add = verbs.add_parser("add", help="register an upstream MCP server (Streamable HTTP)")
        add.add_argument("team", help="the team's slug")
        add.add_argument("name", help="lower-case letters, digits and hyphens: /mcp/gateway/NAME/")
        add.add_argument("url", help="the server's Streamable HTTP endpoint")
        add.add_argument(
            "--header",
            action="append",
            default=[],
            metavar="NAME:VALUE",
            help="a header sent with every request to it (its credentials); stored sealed",
        )
        add.add_argument("--policy", choices=McpUpstream.Policy.values, default=McpUpstream.Policy.RULES,
                         help="the default policy of its tools (ask, rules, never)")  # fmt: skip
        listing = verbs.add_parser("list", help="a team's upstreams")
        listing.add_argument("team")
        refresh = verbs.add_parser("refresh", help="ask an upstream for its tools now")
        refresh.add_argument("team")
        refresh.add_argument("name")
        policy = verbs.add_parser("policy", help="set a tool's policy (or, without --tool, the default)")
        policy.add_argument("team")
        policy.add_argument("name")
        policy.add_argument("policy", choices=McpUpstream.Policy.values)
        policy.add_argument("--tool", default="", help="the tool's name")
        remove = verbs.add_parser("remove", help="remove an upstream")
        remove.add_argument("team")
        remove.add_argument("name")

    def handle(self, *args: Any, **options: Any) -> None:
        team = Team.objects.filter(slug=options["team"]).first()
        if team is None:
            slugs = ", ".join(Team.objects.values_list("slug", flat=True)) or "none yet"
            raise CommandError(f"no team with slug {options['team']!r} (teams: {slugs})")
        verb = options["verb"]
        try:
            if verb == "add":
                self.add(team, options)
            elif verb == "list":
                for upstream in McpUpstream.objects.filter(team=team):
                    tools = ", ".join(tool.get("name", "") for tool in upstream.tools) or "not listed yet"
                    self.stdout.write(f"{upstream.name}\t{upstream.url}\t{upstream.default_policy}\t{tools}")
            else:
                found = McpUpstream.objects.filter(team=team, name=options["name"]).first()
                if found is None:
                    raise CommandError(f"{team.slug} has no MCP upstream named {options['name']!r}")
                upstream = found
                if verb == "refresh":
                    self.refresh(upstream)
                elif verb == "policy":
                    engine.gateway.set_policy(upstream, options["tool"], options["policy"], by=None)
                    self.stdout.write(
                        f"{upstream}: {options['tool'] or 'the default'} is {options['policy']}"
                    )
                else:
                    engine.gateway.remove(upstream, by=None)
                    self.stdout.write(f"removed {upstream}")
        except engine.EngineError as exc:
            raise CommandError(str(exc)) from exc

    def add(self, team: Team, options: dict[str, Any]) -> None:
        headers = {}
        for header in options["header"]:
            name, sep, value = header.partition(":")
            if not sep:
                raise CommandError(f"--header {header!r}: write it NAME:VALUE")
            headers[name.strip()] = value.strip()
        upstream = engine.gateway.register(team, options["name"], options["url"], headers, by=None)
        if options["policy"] != upstream.default_policy:
            engine.gateway.set_policy(upstream, "", options["policy"], by=None)
        self.stdout.write(f"added {upstream}: its tools are at /mcp/gateway/{upstream.name}/")
        self.refresh(upstream)

    def refresh(self, upstream: McpUpstream) -> None:
        try:
            tools = gateway_driver.refresh_tools(upstream)
        except gateway_driver.UpstreamFailed as exc:
            self.stderr.write(f"{upstream} could not be asked for its tools: {exc}")
            return
        self.stdout.write(f"{upstream} has {len(tools)} tools: {', '.join(t.get('name', '') for t in tools)}")
