"""Restore rate of a store node: stop it, wipe its data directory, start it, time changelog → RocksDB.

The node logs, per replica, ``caught up at offset X after N offsets in S s`` with a timestamp;
the restore window runs from the earliest replica start (timestamp − S) to the last catch-up,
so the rate is Σ N over that window. The node's ``Status`` (records applied, replica states)
says when the restore is over, and is the fallback measure when the log says nothing.
"""

from __future__ import annotations

import re
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

CAUGHT_UP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*replica (\S+)/(\d+): caught up at offset (\d+) "
                       r"after (\d+) offsets in ([\d.]+)s")


def restore_rate_from_log(text: str, table: str) -> dict[str, Any] | None:
    """Σ offsets / (last catch-up − earliest start) over the replicas of ``table`` that caught up in ``text``."""
    spans = []
    for line in text.splitlines():
        m = CAUGHT_UP.match(line)
        if not m or m.group(2) != table:
            continue
        end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        spans.append((end - float(m.group(6)), end, int(m.group(5))))
    if not spans:
        return None
    start = min(s for s, _, _ in spans)
    end = max(e for _, e, _ in spans)
    records = sum(n for _, _, n in spans)
    # The log rounds S to 0.1 s: never divide by less than that.
    seconds = max(end - start, 0.1)
    return {"records": records, "seconds": round(seconds, 3), "replicas": len(spans),
            "restore_rps": round(records / seconds, 1)}


def data_dir_of(command: list[str]) -> Path | None:
    if "--data-dir" in command:
        return Path(command[command.index("--data-dir") + 1])
    return None


def _status(address: str) -> Any:
    import grpc

    from proto import store_pb2, store_pb2_grpc

    with grpc.insecure_channel(address) as ch:
        return store_pb2_grpc.StoreNodeStub(ch).Status(store_pb2.StatusRequest(), timeout=1)


def measure_restore(stack: Any, node: str, table: str, timeout_s: float = 120.0,
                    say: Callable[[str], None] = print) -> dict[str, Any]:
    """Wipe and restart ``node`` (a store node of ``stack``) and measure its restore of ``table``."""
    import grpc

    from proto import store_pb2

    comp = stack.components[node]
    if comp.role != "store-node":
        raise ValueError(f"{node} is not a store node")
    data = data_dir_of(comp.command)
    home = Path(stack.config.home).resolve()
    # Only ever wipe a directory the stack owns: the node's own data under the stack's home.
    if data is None or home not in data.resolve().parents:
        raise RuntimeError(f"{node}'s data directory {data} is not under the stack's home {home}; not wiping it")
    log_path = Path(comp.log)
    log_from = log_path.stat().st_size if log_path.exists() else 0
    address = comp.addresses["address"]
    say(f"  stopping {node}, wiping {data}, starting it again")
    stack.stop(node)
    shutil.rmtree(data, ignore_errors=True)
    started = time.monotonic()
    stack.start(node)
    serving = (store_pb2.SERVING_ACTIVE, store_pb2.SERVING_STANDBY)
    first: tuple[float, int] | None = None
    done_at: float | None = None
    applied = 0
    replicas = 0
    last_say = started
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        try:
            st = _status(address)
        except grpc.RpcError:
            time.sleep(0.05)
            continue
        now = time.monotonic()
        mine = [(r, c) for r, c, tp in zip(st.replicas, st.counters, st.tables) if tp.split("/")[0] == table]
        if mine:
            applied = sum(c.records_applied for _, c in mine)
            replicas = len(mine)
            if first is None:
                first = (now, applied)
            if all(r.state in serving for r, _ in mine):
                # Settled only if no further replica arrives for a second (assignment comes in steps).
                if done_at is None:
                    done_at = now
                elif now - done_at >= 1.0:
                    break
            else:
                done_at = None
        if now - last_say >= 2:
            last_say = now
            say(f"  … {node}: {replicas} replicas, {applied} records applied ({now - started:.0f}s)")
        time.sleep(0.05)
    else:
        raise TimeoutError(f"{node} did not finish restoring {table} within {timeout_s:.0f}s")
    out: dict[str, Any] = {"node": node, "replicas": replicas, "records_applied": applied,
                           "restart_to_served_s": round((done_at or time.monotonic()) - started, 3)}
    if first is not None and done_at is not None and done_at > first[0]:
        out["status_rps"] = round((applied - first[1]) / (done_at - first[0]), 1)
    text = log_path.read_bytes()[log_from:].decode("utf-8", "replace") if log_path.exists() else ""
    from_log = restore_rate_from_log(text, table)
    if from_log:
        out["log"] = from_log
        out["restore_rps"] = from_log["restore_rps"]
    else:
        out["restore_rps"] = out.get("status_rps")
    say(f"  restore of {node}: {out.get('restore_rps')} records/s ({applied} records, {replicas} replicas)")
    return out
