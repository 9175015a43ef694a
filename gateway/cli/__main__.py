"""`python -m gateway.cli`: the same command as the `gateway` script."""

from gateway.cli import main

main()
