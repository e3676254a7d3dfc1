import sys

from loadtest.peers import main

sys.exit(main())
