"""`python -m autoctx._cli`: the `autoctx` command, for a child process started from Python."""

from . import main

main()
