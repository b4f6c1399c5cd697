from opod.cli.main import run

run()
