"""Roles per team membership: Team.members' table becomes the Membership model's (the same
table, columns and indexes: only Django's picture of it changes), with a role; every member
it had becomes an approver, which is what membership meant before roles. The role's default is
the database's too, for the processes of the version before during a rolling upgrade."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        ("actions", "0021_journal_function"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Membership",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        (
                            "team",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="actions.team"
                            ),
                        ),
                        (
                            "user",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="memberships",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                    ],
                    options={"db_table": "actions_team_members", "unique_together": {("team", "user")}},
                ),
                migrations.AlterField(
                    model_name="team",
                    name="members",
                    field=models.ManyToManyField(
                        blank=True, related_name="teams", through="actions.Membership", to=settings.AUTH_USER_MODEL
                    ),
                ),
            ],
            database_operations=[],
        ),
        migrations.AddField(
            model_name="membership",
            name="role",
            field=models.CharField(
                choices=[("viewer", "viewer"), ("approver", "approver"), ("admin", "admin"), ("auditor", "auditor")],
                default="approver",
                db_default="approver",
                max_length=16,
            ),
        ),
    ]
