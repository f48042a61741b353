"""Inside a pool rank: answer the controller's request for the flight recorder's records.

Runs in pool-mode rank processes only (started by :mod:`main` before anything else starts a
thread). A rank stuck in a collective is inside C++ with the GIL released, where no Python signal
handler runs; a thread waiting in ``sigwait`` is woken by the signal itself, takes the GIL the
main thread does not hold, and writes PyTorch's flight-recorder records (every collective the
rank issued: op, group, sequence number, shapes, completion; JSON, :func:`collectives.dump`) to a
file beside the rank's log. The controller reads it to say which collective each rank is in
(:mod:`collectives`).

``FR_SIGNAL`` is blocked in the rank's threads (a mask the threads and processes it starts
inherit), so it reaches only the waiting thread. The dump costs nothing until it is asked for.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from ...rank.groupstate import flight_records

#: The signal by which the controller asks a rank for its flight-recorder dump.
FR_SIGNAL = signal.SIGUSR2
#: Written instead of a dump when the recorder is off (``TORCH_FR_BUFFER_SIZE=0``) or fails.
NO_RECORDS = b"no records"


def fr_path(log_path: str) -> str:
    """Where the rank whose log is ``log_path`` writes its dump."""
    return log_path.removesuffix(".log") + ".fr"


def start_responder(log_path: str) -> None:
    """Block FR_SIGNAL in this (still single-threaded) process and start the waiting thread."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {FR_SIGNAL})
    thread = threading.Thread(
        target=_serve, args=(fr_path(log_path),), name="distrank-flight-recorder", daemon=True
    )
    thread.start()


def _serve(path: str) -> None:
    while True:
        signal.sigwait({FR_SIGNAL})
        data = flight_records() or NO_RECORDS
        with contextlib.suppress(OSError):
            with open(path + ".tmp", "wb") as out:
                out.write(data)
            os.replace(path + ".tmp", path)  # the controller never reads half a dump
