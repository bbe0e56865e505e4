import sys

from pystreams.cli import main

sys.exit(main())
