import sys

from hexir.cli import main

sys.exit(main())
