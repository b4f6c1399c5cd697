from opod.cli.entry import run

run()
