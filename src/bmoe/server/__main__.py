import sys

from bmoe.server.main import main

sys.exit(main())
