import sys

from traceless.cli.parser import main

sys.exit(main())
