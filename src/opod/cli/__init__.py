"""The ``opod`` command line: typer commands that start a process or talk HTTP to one."""
