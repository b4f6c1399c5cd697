"""``opod ctl``: a command for every operation of the management API's fleet, catalog and placement.

It talks to the leader's admin listener (``OPOD_ADMIN_URL``, else this machine's
127.0.0.1:9090) with the admin key (``OPOD_ADMIN_KEY``, else ``admin.key`` in the
leader's home). Each command prints a table, or with ``--json`` the API's answer.
"""

from __future__ import annotations

import typer

from opod.cli.ctl import fleet, models, presets, replicas

app = typer.Typer(
    help="Operate the fleet through the management API: summary, nodes, models, replicas, restarts, placement, presets, weights.",
    no_args_is_help=True,
)
app.command("summary")(fleet.summary)
app.add_typer(fleet.nodes, name="nodes")
app.add_typer(fleet.agents, name="agents")
app.add_typer(models.models, name="models")
app.command("replicas")(replicas.replicas)
app.command("restart")(replicas.restart)
app.command("explain")(replicas.explain)
app.add_typer(presets.presets, name="presets")
app.add_typer(presets.weights, name="weights")
