import sys

from bmoe.cli.main import main

sys.exit(main())
