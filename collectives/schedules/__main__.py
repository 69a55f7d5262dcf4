"""``python -m collectives.schedules FILE.py:FUNCTION``: verify a schedule builder (:func:`collectives.schedules.verify.main`)."""
import sys

from collectives.schedules.verify import main

sys.exit(main())
