import sys

from traceless_tools.cli import main

sys.exit(main())
