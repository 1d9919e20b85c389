"""``python -m gpuportal_cli`` (and a zipapp of this package) runs the CLI."""

import sys

from gpuportal_cli.main import main

sys.exit(main())
