"""How a trainbench session stops: Ctrl-C or SIGTERM mark its saved run incomplete, and a SIGTERM after the last
case waits for the save and the summary."""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass


@dataclass
class Stopping:
    interrupted: bool = False  # Ctrl-C or SIGTERM: the saved run is marked incomplete
    finishing: bool = False  # the last case has ended: nothing is left to measure
    late_sigterms: int = 0  # SIGTERMs after the last case: the first waits for the save and the summary
    previous_sigterm: object = None  # the SIGTERM handler to restore at the end

    def stop_cleanly_on_sigterm(self) -> None:
        """SIGTERM (a CI job cancelled, a timeout) ends the session as Ctrl-C does: the case running stops, its
        setup closes (loader workers end), and the cases already measured are saved, marked incomplete.
        Without this, the default action kills the process with nothing written."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum, frame):
            if self.finishing:  # everything is measured: the save and the summary finish first
                self.late_sigterms += 1
                if self.late_sigterms == 1:
                    return
            raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")  # a second one stops even the save

        self.previous_sigterm = signal.signal(signal.SIGTERM, interrupt)

    @contextlib.contextmanager
    def saving_run(self):
        self.finishing = True  # as after the last case, should a save begin without the loop's end
        yield

    def restore(self) -> None:
        if self.previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self.previous_sigterm)
