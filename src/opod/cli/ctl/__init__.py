"""``opod ctl``: a command for every operation of the management API's fleet, catalog, placement, tenancy, guard and
records.

It talks to the leader's admin listener (``OPOD_ADMIN_URL``, else this machine's
127.0.0.1:9090) with the admin key (``OPOD_ADMIN_KEY``, else ``admin.key`` in the
leader's home). Each command prints a table, or with ``--json`` the API's answer.
"""

from __future__ import annotations

import typer

from opod.cli.ctl import (
    adapters,
    canary,
    evals,
    federation,
    fleet,
    guard,
    models,
    operations,
    people,
    presets,
    replicas,
    serving,
    settings,
    tenancy,
    updates,
    usage,
)

app = typer.Typer(
    help="Operate the fleet through the management API: summary, nodes, models, replicas, restarts, placement, presets, registry plans and serve jobs, weights, "
    "tenancy, people, keys, quotas, guard policies, usage, audit, settings, client jobs, webhooks, secrets, federation, quality suites and gates.",
    no_args_is_help=True,
)
app.command("summary")(fleet.summary)
app.add_typer(fleet.nodes, name="nodes")
app.add_typer(fleet.agents, name="agents")
app.add_typer(models.models, name="models")
models.models.add_typer(canary.canary, name="canary")
models.models.command("adapters")(adapters.set_adapters)
app.command("replicas")(replicas.replicas)
app.command("restart")(replicas.restart)
app.command("explain")(replicas.explain)
app.add_typer(presets.presets, name="presets")
app.command("plan")(serving.plan)
app.command("serve")(serving.serve)
app.add_typer(serving.serve_jobs, name="serve-jobs")
app.command("updates")(updates.updates)
models.models.command("update")(updates.update)
models.models.command("rollback")(updates.rollback)
models.models.command("origin")(updates.origin)
app.add_typer(evals.evals, name="eval")
app.add_typer(presets.weights, name="weights")
app.add_typer(tenancy.orgs, name="orgs")
app.add_typer(tenancy.teams, name="teams")
app.add_typer(tenancy.projects, name="projects")
app.add_typer(people.users, name="users")
app.add_typer(people.keys, name="keys")
app.add_typer(people.secrets, name="secrets")
app.add_typer(operations.quotas, name="quotas")
app.add_typer(guard.guard, name="guard")
app.add_typer(usage.usage, name="usage")
app.command("audit")(usage.audit)
app.add_typer(settings.settings, name="settings")
app.add_typer(operations.jobs, name="jobs")
app.add_typer(operations.notify, name="notify")
app.add_typer(federation.federation, name="federation")
