import sys

from ledgerlm.cli.main import main

sys.exit(main())
