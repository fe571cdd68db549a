"""python -m rlctl.cli"""

from rlctl.cli import main

main()
