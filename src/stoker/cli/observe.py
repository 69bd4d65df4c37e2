"""``stoker doctor`` and ``stoker top``."""

from __future__ import annotations

import argparse
import json


def cmd_doctor(args: argparse.Namespace) -> int:
    import time

    from stoker.observe import doctor

    if args.prometheus:
        now = time.time()
        before = doctor.scrape_prometheus(args.prometheus, now - args.window)
        after = doctor.scrape_prometheus(args.prometheus, now)
        seconds = args.window
    else:
        endpoints = doctor.endpoints_or_discover(args.endpoint)
        before, t0 = doctor.scrape(endpoints), time.monotonic()
        time.sleep(args.window)  # the measurement window
        after = doctor.scrape(endpoints)
        seconds = time.monotonic() - t0
    bandwidth = args.storage_bandwidth * 1e6 if args.storage_bandwidth else None
    d = doctor.diagnose(doctor.evidence(before, after, seconds), bandwidth)
    print(json.dumps(d.to_dict(), indent=1) if args.json else doctor.render(d))
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from stoker.observe import top

    return top.run(args.endpoint, args.interval, args.iterations)
