"""A wall clock a test moves by hand, for code that reads epoch seconds (the CronJob controller's
`wall=`): it starts at the real time, so schedules computed from it look like today's, and then
stands still, so no test waits for a real minute to pass."""

from __future__ import annotations

import time

from tests.helpers import Clock


class Wall(Clock):
    """Epoch seconds that move only when a test says so (set `.now`)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = time.time()
