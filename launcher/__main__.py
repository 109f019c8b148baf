"""`python -m launcher`: the installed command `ddpl`, from any interpreter that has the package."""

from launcher.cli import main

main()
