"""``python -m prescreen.cli``: the console script."""

from prescreen.cli import main

main()
