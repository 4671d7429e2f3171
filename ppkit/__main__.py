import sys

from ppkit.cli import main

sys.exit(main())
