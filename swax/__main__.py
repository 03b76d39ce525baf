import sys

from swax.cli import main

sys.exit(main())
