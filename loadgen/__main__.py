"""``python -m loadgen``: the command line."""

import signal
import sys


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signum)


if __name__ == "__main__":
    # Until the command line's own handlers are in place (its modules take a moment to
    # import on a busy machine), SIGTERM and SIGHUP end it as interrupted, as Ctrl-C does,
    # not by the signal's default action.
    hangup = getattr(signal, "SIGHUP", None)
    for sig in (signal.SIGTERM, hangup):
        if sig is not None:
            signal.signal(sig, _stop)
    try:
        from loadgen.cli import main
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        sys.exit(129 if hangup is not None and e.args and e.args[0] == hangup else 130)
    sys.exit(main())
