#!/usr/bin/env python3
"""Write `justonce_keys` tables through the real justonce==0.2.0 library.

Used by reckon's Rust integration tests to get source data that the actual
library produced (not a hand-written imitation of it).

    python justonce_writer.py --backend sqlite|postgres|mysql --dsn DSN SCENARIO [options]

    DSN   sqlite:   a file path (created if missing)
          postgres: postgresql://user@host:port/db   (handed to PostgresStore as-is)
          mysql:    mysql://root@127.0.0.1:3306/db   (parsed into Django DATABASES;
                    the store is justonce's DjangoStore on Django's mysql backend
                    with PyMySQL standing in for mysqlclient)

    SCENARIO
      populate                 fill an empty store (see README.md)
      mutate                   change a store that `populate` filled
      bulk --count N --start I insert N rows charge:v1:BULK-{I..I+N-1} in the
                               library's exact encoding, with raw SQL
      unknown --key K ...      run the effect for each key through the engine with the
                               outcome write lost: the library marks each UNKNOWN
      app-complete --key K --response JSON
                               the application resolves K itself: store.complete(K, ...)
      rows --key K ...         print the rows of these keys (raw stored values)
      retry --key K            the application retries K through the engine: did the
                               effect run again, or did the library answer from the row?

Every scenario prints exactly one JSON document on stdout; diagnostics go to
stderr. Exit status is non-zero if the library did not behave as expected.
"""

from __future__ import annotations

import argparse
import decimal
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable
from urllib.parse import unquote, urlparse

import justonce
from justonce import Idempotent, State, StoreError, fingerprint, operation_key

THIS = os.path.abspath(__file__)
TABLE = "justonce_keys"
MONTH = 30 * 24 * 3600.0  # == justonce.DEFAULT_RETENTION_SECONDS

# Keys ----------------------------------------------------------------------

K_ORD17 = operation_key("charge", "ORD-17")          # charge:v1:ORD-17
K_REFUND17 = operation_key("refund", "ORD-17")       # refund:v1:ORD-17
K_ORD170 = operation_key("charge", "ORD-170")        # charge:v1:ORD-170
K_UNICODE = operation_key("charge", "ORD-ü-日本")     # charge:v1:ORD-ü-日本
K_QUOTES = "charge:v1:o'r\";DROP TABLE x;--"
K_UUID = "3f2b8c1e-9a4d-4e7b-8f6a-2d5c0b1e7a93"        # an Idempotency-Key header
K_LONG = "charge:v1:" + "L" * 890                     # 900 characters
K_LIST = operation_key("charge", "ORD-LIST")
K_FALSE = operation_key("charge", "ORD-FALSE")
K_JSONISH = operation_key("charge", "ORD-JSONISH")
K_FOREVER = operation_key("charge", "ORD-FOREVER")
K_COLON = operation_key("charge", "tenant:7", "ORD-9")  # charge:v1:tenant:7:ORD-9
K_FAILED = operation_key("charge", "ORD-DECLINED")
K_TRANSIENT = operation_key("charge", "ORD-TRANSIENT")
K_UNKNOWN_STORE = operation_key("charge", "ORD-LOST-WRITE")
K_UNKNOWN_DECIMAL = operation_key("charge", "ORD-DECIMAL")
K_CRASHED = operation_key("charge", "ORD-CRASHED")
K_CRASHED2 = operation_key("charge", "ORD-CRASHED-2")
K_RECLAIMED = operation_key("charge", "ORD-RECLAIMED")
K_LEASED_A = operation_key("charge", "ORD-LEASED-A")
K_LEASED_B = operation_key("charge", "ORD-LEASED-B")
K_LEASED_C = operation_key("charge", "ORD-LEASED-C")  # stays leased after mutate
K_EXPIRED = operation_key("charge", "ORD-EXPIRED")
K_EXPIRES_SOON = operation_key("charge", "ORD-EXPIRES-SOON")

SHORT_LEASE = 1.0       # seconds: lease of the claims whose holder gets SIGKILLed
LONG_LEASE = 3600.0     # seconds: lease of the claims that stay valid
SOON_RETENTION = 1.5    # seconds: retention of the row `mutate` sweeps

NESTED = {
    "id": "ch_3NfX",
    "amount": {"value": 1999, "currency": "EUR"},
    "tags": ["vip", "retry"],
    "captured": True,
    "refund": None,
    "note": "ü 日本 \"quoted\" \\ back",
}


def payload_for(key: str) -> dict[str, Any]:
    """Deterministic request payload per key (request_hash = fingerprint of it)."""
    return {"key": key, "amount": 1999, "currency": "EUR"}


# Backends ------------------------------------------------------------------


def configure_django(dsn: str) -> None:
    u = urlparse(dsn)
    if u.scheme not in ("mysql", "mariadb"):
        raise SystemExit(f"mysql DSN must look like mysql://user@host:port/db, got {dsn!r}")
    import pymysql

    # Django's mysql backend imports MySQLdb (mysqlclient) and checks its
    # version; PyMySQL ships a compatible shim. PyMySQL 1.2.x already reports
    # version_info (2, 2, 8, ...); older ones needed the usual override.
    if tuple(pymysql.version_info[:3]) < (1, 4, 3):
        pymysql.version_info = (2, 2, 8, "final", 0)
    pymysql.install_as_MySQLdb()

    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.mysql",
                    "NAME": unquote(u.path.lstrip("/")),
                    "USER": unquote(u.username or "root"),
                    "PASSWORD": unquote(u.password or ""),
                    "HOST": u.hostname or "127.0.0.1",
                    "PORT": str(u.port or 3306),
                    "OPTIONS": {"charset": "utf8mb4"},
                }
            },
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()


def make_store(backend: str, dsn: str) -> Any:
    """The library's own store; each creates the table the way the library does."""
    if backend == "sqlite":
        from justonce.stores import SqliteStore

        return SqliteStore(dsn)  # runs its CREATE TABLE/INDEX IF NOT EXISTS
    if backend == "postgres":
        from justonce.stores import PostgresStore

        return PostgresStore(dsn)  # create_schema=True by default
    if backend == "mysql":
        configure_django(dsn)
        from justonce.stores.django_store import DjangoStore

        # DjangoStore does NOT create its table by default (create_table=False)
        # and has no migration/app: create_table=True runs DjangoStore.ddl().
        return DjangoStore(create_table=True)
    raise SystemExit(f"unknown backend {backend!r}")


def close_store(backend: str, store: Any) -> None:
    if backend == "sqlite":
        store.close()
    elif backend == "mysql":
        from django.db import connections

        connections.close_all()


COLS = ["key", "state", "request_hash", "response", "attempts",
        "created_at", "updated_at", "expires_at"]


def read_rows(backend: str, dsn: str) -> list[dict[str, Any]]:
    """Every row, with a raw SELECT (response as raw stored text), sorted by key."""
    if backend == "sqlite":
        import sqlite3

        conn = sqlite3.connect(dsn)
        try:
            rows = conn.execute(f"SELECT {', '.join(COLS)} FROM {TABLE}").fetchall()
        finally:
            conn.close()
    elif backend == "postgres":
        import psycopg

        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT key, state, request_hash, response::text, attempts, "
                f"created_at, updated_at, expires_at FROM {TABLE}"
            ).fetchall()
    else:
        from django.db import connections

        with connections["default"].cursor() as cur:
            cur.execute(
                "SELECT `key`, state, request_hash, response, attempts, "
                f"created_at, updated_at, expires_at FROM {TABLE}"
            )
            rows = cur.fetchall()
    out = [dict(zip(COLS, r)) for r in rows]
    for r in out:
        if isinstance(r["response"], (bytes, bytearray, memoryview)):
            r["response"] = bytes(r["response"]).decode("utf-8")
    out.sort(key=lambda r: r["key"])
    return out


# Helpers -------------------------------------------------------------------


class Failure(Exception):
    pass


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise Failure(msg)


class LostCompleteWrite:
    """Delegates to a real store, but its `complete()` fails for chosen keys.

    Models the outcome write failing (connection dropped, DB failover) after
    the effect ran. The engine (core.Idempotent.run) catches that and calls
    `store.mark_unknown(key)` on the real store — the library's own path to
    UNKNOWN.
    """

    def __init__(self, inner: Any, fail_keys: set[str]) -> None:
        self._inner = inner
        self._fail = fail_keys

    def complete(self, key: str, response: Any, *, retention_seconds: float | None = None) -> None:
        if key in self._fail:
            raise StoreError(f"simulated: connection lost while recording {key!r}")
        self._inner.complete(key, response, retention_seconds=retention_seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def run_ok(engine: Idempotent, key: str, value: Any) -> None:
    res = engine.run(key, lambda: value, payload=payload_for(key))
    check(res.executed, f"{key}: expected the effect to run")


def run_raises(engine: Idempotent, key: str, effect: Callable[[], Any], exc: type,
               **kw: Any) -> None:
    try:
        engine.run(key, effect, payload=payload_for(key), **kw)
    except exc:
        return
    raise Failure(f"{key}: expected {exc.__name__}")


def spawn_holders(args: argparse.Namespace, leases: dict[str, float]) -> None:
    """Claim each key in a child process, then SIGKILL it mid-effect.

    The child runs Idempotent(store, ttl_seconds=lease).run(key, effect) and its
    effect announces itself and sleeps; the parent kills it with os.kill(SIGKILL)
    while the effect is running, so the claim stays in_progress.
    """
    procs = {}
    for key, lease in leases.items():
        procs[key] = subprocess.Popen(
            [sys.executable, THIS, "--backend", args.backend, "--dsn", args.dsn,
             "_hold", "--key", key, "--lease", repr(lease)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
    for key, p in procs.items():
        line = p.stdout.readline() if p.stdout else ""
        check(line.strip() == "EFFECT-STARTED", f"holder for {key} did not start: {line!r}")
        os.kill(p.pid, signal.SIGKILL)
    for key, p in procs.items():
        rc = p.wait(timeout=30)
        if p.stdout:
            p.stdout.close()
        check(rc == -signal.SIGKILL, f"holder for {key} exited {rc}, not by SIGKILL")


def wait_until_expired(store: Any, keys: list[str]) -> None:
    deadline = max(store.lookup(k).expires_at for k in keys)
    while time.time() <= deadline:
        time.sleep(max(0.01, deadline - time.time() + 0.02))


def classify(rows: list[dict[str, Any]], now: float) -> dict[str, list[str]]:
    def keys(pred: Callable[[dict[str, Any]], bool]) -> list[str]:
        return [r["key"] for r in rows if pred(r)]

    return {
        "succeeded": keys(lambda r: r["state"] == "succeeded"),
        "failed": keys(lambda r: r["state"] == "failed"),
        "abandoned": keys(lambda r: r["state"] == "in_progress"
                          and r["expires_at"] is not None and r["expires_at"] < now),
        "leased": keys(lambda r: r["state"] == "in_progress"
                       and (r["expires_at"] is None or r["expires_at"] >= now)),
        "attempts_gt_1": keys(lambda r: r["attempts"] > 1),
    }


def swept_by(engine: Idempotent, backend: str, dsn: str,
             now: float | None = None) -> tuple[int, list[str]]:
    before = {r["key"] for r in read_rows(backend, dsn)}
    # The library's sweep: DELETE succeeded/failed rows with expires_at < now.
    n = engine.sweep(now=now)
    after = {r["key"] for r in read_rows(backend, dsn)}
    gone = sorted(before - after)
    check(n == len(gone), f"sweep reported {n} but {len(gone)} rows vanished")
    return n, gone


# Scenarios -----------------------------------------------------------------


def scenario_populate(args: argparse.Namespace) -> dict[str, Any]:
    backend, dsn = args.backend, args.dsn
    store = make_store(backend, dsn)
    check(not read_rows(backend, dsn), "populate wants an empty justonce_keys table")

    engine = Idempotent(store)  # defaults: 15 min lease, 30 day retention
    forever = Idempotent(store, retention_seconds=None)  # expires_at NULL

    # A succeeded row whose retention ends almost at once: swept below.
    run_ok(Idempotent(store, retention_seconds=0.2), K_EXPIRED, {"charge_id": "ch_old"})

    # Claims held by processes that get SIGKILLed mid-effect.
    spawn_holders(args, {K_CRASHED: SHORT_LEASE, K_CRASHED2: SHORT_LEASE,
                         K_RECLAIMED: SHORT_LEASE,
                         K_LEASED_A: LONG_LEASE, K_LEASED_B: LONG_LEASE,
                         K_LEASED_C: LONG_LEASE})

    # Successes with awkward responses and awkward keys.
    skipped: dict[str, str] = {}
    responses: dict[str, Any] = {
        K_ORD17: "done",
        K_REFUND17: None,
        K_ORD170: NESTED,
        K_UNICODE: 1999,
        K_QUOTES: 19.99,
        K_UUID: {"status": 201, "body": {"id": "pay_1"}},
        K_LIST: [1, "two", None, {"three": 3}],
        K_FALSE: False,
        K_JSONISH: '{"looks":"like an object"}',  # a JSON *string* holding JSON text
        K_COLON: "ok",
    }
    if backend == "mysql":
        skipped[K_LONG] = ("DjangoStore's MySQL DDL makes `key` VARCHAR(255); a 900-char key "
                           "does not fit (INSERT IGNORE would truncate it), so it is not written")
    else:
        responses[K_LONG] = "long-key-ok"
    for key, value in responses.items():
        run_ok(engine, key, value)
    run_ok(forever, K_FOREVER, {"kept": "forever"})
    responses[K_FOREVER] = {"kept": "forever"}

    # A deduplicated replay and a key reuse change nothing.
    replay = engine.run(K_ORD17, lambda: "again", payload=payload_for(K_ORD17))
    check(not replay.executed and replay.value == "done", "replay of ORD-17 re-ran")
    try:
        engine.run(K_ORD17, lambda: "x", payload={"different": True})
        raise Failure("key reuse was not refused")
    except justonce.KeyReuseError:
        pass

    # Terminal failure: effect raises, retry_on_failure=False -> state failed.
    def declined() -> Any:
        raise RuntimeError("card declined")

    run_raises(engine, K_FAILED, declined, RuntimeError, retry_on_failure=False)
    # Transient failure: effect raises, retry_on_failure=True -> row DELETED.
    run_raises(engine, K_TRANSIENT, declined, RuntimeError, retry_on_failure=True)

    # UNKNOWN, two real ways into Idempotent.run's `except: mark_unknown`:
    # (1) the store's complete() write fails after the effect ran;
    flaky = Idempotent(LostCompleteWrite(store, {K_UNKNOWN_STORE}))
    run_raises(flaky, K_UNKNOWN_STORE, lambda: {"charge_id": "ch_lost"}, StoreError)
    time.sleep(0.01)  # distinct updated_at, so unresolved() order is meaningful
    # (2) the effect returns a value json.dumps cannot encode (a Decimal): the
    # library's complete() raises TypeError before writing, same path.
    run_raises(engine, K_UNKNOWN_DECIMAL, lambda: decimal.Decimal("19.99"), TypeError)

    # Reclaim: the SIGKILLed holder's 1 s lease expires; a retry with the same
    # request reclaims (attempts 2) and completes.
    wait_until_expired(store, [K_CRASHED, K_CRASHED2, K_RECLAIMED, K_EXPIRED])
    run_ok(engine, K_RECLAIMED, {"charge_id": "ch_retry", "attempt": 2})
    responses[K_RECLAIMED] = {"charge_id": "ch_retry", "attempt": 2}
    check(store.lookup(K_RECLAIMED).attempts == 2, "reclaim did not bump attempts")

    # The row `mutate` sweeps: retention 1.5 s. Our sweep runs as of a moment
    # before it was written, so it deletes ORD-EXPIRED (0.2 s retention, long
    # past) and, deterministically, not this one.
    sweep_as_of = time.time()
    run_ok(Idempotent(store, retention_seconds=SOON_RETENTION), K_EXPIRES_SOON,
           {"charge_id": "ch_soon"})
    responses[K_EXPIRES_SOON] = {"charge_id": "ch_soon"}

    _, swept = swept_by(engine, backend, dsn, now=sweep_as_of)
    check(swept == [K_EXPIRED], f"sweep deleted {swept}, wanted [{K_EXPIRED}]")

    unresolved = [r.key for r in engine.unresolved()]
    rows = read_rows(backend, dsn)
    now = time.time()
    got = classify(rows, now)
    check(unresolved == [K_UNKNOWN_STORE, K_UNKNOWN_DECIMAL], f"unresolved() = {unresolved}")
    check(sorted(got["abandoned"]) == sorted([K_CRASHED, K_CRASHED2]), f"abandoned {got}")
    check(sorted(got["leased"]) == sorted([K_LEASED_A, K_LEASED_B, K_LEASED_C]),
          f"leased {got}")
    check(got["attempts_gt_1"] == [K_RECLAIMED], f"attempts {got}")
    check(got["failed"] == [K_FAILED], f"failed {got}")
    check(sorted(got["succeeded"]) == sorted(responses), f"succeeded {got}")
    present = {r["key"] for r in rows}
    check(K_TRANSIENT not in present and K_EXPIRED not in present, "deleted rows present")
    for r in rows:
        if r["key"] in responses:
            raw = r["response"]
            check((None if raw is None else json.loads(raw)) == responses[r["key"]],
                  f"{r['key']}: stored response {raw!r}")
        check(r["request_hash"] == fingerprint(payload_for(r["key"])), f"{r['key']}: hash")
    close_store(backend, store)

    return {
        "rows": rows,
        "expect": {
            "backend": backend,
            "as_of": now,
            "unresolved_unknown": unresolved,  # engine.unresolved(): oldest updated_at first
            "abandoned": sorted(got["abandoned"]),
            "leased": sorted(got["leased"]),
            "swept": swept,
            "reclaimed": [K_RECLAIMED],
            "succeeded": sorted(got["succeeded"]),
            "failed": got["failed"],
            "released": [K_TRANSIENT],  # fail(terminal=False) deleted the row
            "skipped": skipped,
            "responses": {k: responses[k] for k in sorted(responses)},
            "for_mutate": {"complete": K_LEASED_A, "mark_unknown": K_LEASED_B,
                           "reclaim": K_CRASHED2, "sweep": K_EXPIRES_SOON},
            "request_hash_of": "fingerprint({\"key\": KEY, \"amount\": 1999, \"currency\": \"EUR\"})",
        },
    }


def scenario_mutate(args: argparse.Namespace) -> dict[str, Any]:
    backend, dsn = args.backend, args.dsn
    store = make_store(backend, dsn)
    engine = Idempotent(store)
    before = {r["key"]: r for r in read_rows(backend, dsn)}
    for k, st in ((K_LEASED_A, "in_progress"), (K_LEASED_B, "in_progress"),
                  (K_CRASHED2, "in_progress"), (K_EXPIRES_SOON, "succeeded")):
        check(k in before and before[k]["state"] == st,
              f"mutate needs a populated store: {k} should be {st}")

    # justonce has no holder token: complete() is keyed by `key` alone, so the
    # outcome write for a still-leased claim may come from any process. This is
    # the (killed-in-populate) holder's outcome write arriving late.
    late = {"charge_id": "ch_late", "status": "captured"}
    store.complete(K_LEASED_A, late, retention_seconds=MONTH)
    # A claim whose outcome the operator declares unresolved.
    store.mark_unknown(K_LEASED_B)
    # A retry of the crashed request: the 1 s lease is long gone -> reclaim.
    wait_until_expired(store, [K_CRASHED2])
    reclaim_value = {"charge_id": "ch_retry_2", "attempt": 2}
    run_ok(engine, K_CRASHED2, reclaim_value)
    # Sweep after ORD-EXPIRES-SOON's 1.5 s retention ran out.
    wait_until_expired(store, [K_EXPIRES_SOON])
    _, swept = swept_by(engine, backend, dsn)
    check(swept == [K_EXPIRES_SOON], f"sweep deleted {swept}")

    rows = read_rows(backend, dsn)
    after = {r["key"]: r for r in rows}
    check(after[K_LEASED_A]["state"] == "succeeded", "complete failed")
    check(after[K_LEASED_B]["state"] == "unknown" and after[K_LEASED_B]["expires_at"] is None,
          "mark_unknown failed")
    check(after[K_CRASHED2]["attempts"] == before[K_CRASHED2]["attempts"] + 1, "no reclaim")
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    check(changed == sorted([K_LEASED_A, K_LEASED_B, K_CRASHED2, K_EXPIRES_SOON]),
          f"unexpected changes: {changed}")
    now = time.time()
    got = classify(rows, now)
    unresolved = [r.key for r in engine.unresolved()]
    close_store(backend, store)
    return {
        "rows": rows,
        "expect": {
            "backend": backend,
            "as_of": now,
            "completed": [K_LEASED_A],
            "marked_unknown": [K_LEASED_B],
            "reclaimed": [K_CRASHED2],
            "swept": swept,
            "responses": {K_LEASED_A: late, K_CRASHED2: reclaim_value},
            "unresolved_unknown": unresolved,
            "abandoned": sorted(got["abandoned"]),
            "leased": sorted(got["leased"]),
        },
    }


def scenario_bulk(args: argparse.Namespace) -> dict[str, Any]:
    backend, dsn = args.backend, args.dsn
    n, start = args.count, args.start
    store = make_store(backend, dsn)  # table created by the library
    base = time.time() - n * 0.001 - 1.0
    data = []
    for j, i in enumerate(range(start, start + n)):
        key = f"charge:v1:BULK-{i}"
        request_hash = fingerprint({"order": f"BULK-{i}", "amount": 100 + i % 900,
                                    "currency": "EUR"})
        created = base + j * 0.001
        updated = created + 0.25
        if i % 100 == 0:   # unknown, exactly as mark_unknown leaves it
            data.append((key, "unknown", request_hash, None, 1, created, updated, None))
        else:              # succeeded, as complete(retention=30 days) leaves it
            resp = json.dumps({"charge_id": f"ch_bulk_{i}", "amount": 100 + i % 900,
                               "status": "captured"})
            data.append((key, "succeeded", request_hash, resp, 1, created, updated,
                         updated + MONTH))
    if backend == "sqlite":
        store.close()
        import sqlite3

        conn = sqlite3.connect(dsn, timeout=30)
        with conn:
            conn.executemany(f"INSERT INTO {TABLE} ({', '.join(COLS)}) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", data)
        conn.close()
    elif backend == "postgres":
        import psycopg

        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY {TABLE} ({', '.join(COLS)}) FROM STDIN") as cp:
                for row in data:
                    cp.write_row(row)
    else:
        from django.db import connections, transaction

        with transaction.atomic(), connections["default"].cursor() as cur:
            # PyMySQL turns this executemany into multi-row INSERTs.
            cur.executemany(
                f"INSERT INTO {TABLE} (`key`, state, request_hash, response, attempts, "
                "created_at, updated_at, expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                data,
            )
        close_store(backend, store)
    return {"rows_written": n}


# Write-back scenarios (reckon issue 4 item 7) ---------------------------------


def scenario_unknown(args: argparse.Namespace) -> dict[str, Any]:
    """UNKNOWN rows the library's own way: the effect ran, recording it failed."""
    store = make_store(args.backend, args.dsn)
    try:
        flaky = Idempotent(LostCompleteWrite(store, set(args.key)))
        for k in args.key:
            run_raises(flaky, k, lambda k=k: {"charge_id": f"ch_{k}"}, StoreError)
            time.sleep(0.002)  # distinct updated_at per row
        for k in args.key:
            rec = store.lookup(k)
            check(rec is not None and rec.state == State.UNKNOWN, f"{k} is not unknown")
    finally:
        close_store(args.backend, store)
    return {"rows": rows_of(args.backend, args.dsn, args.key)}


def scenario_app_complete(args: argparse.Namespace) -> dict[str, Any]:
    """The application records the outcome of K itself (its own reconciliation)."""
    store = make_store(args.backend, args.dsn)
    try:
        store.complete(args.key[0], json.loads(args.response))
    finally:
        close_store(args.backend, store)
    return {"rows": rows_of(args.backend, args.dsn, args.key)}


def scenario_retry(args: argparse.Namespace) -> dict[str, Any]:
    store = make_store(args.backend, args.dsn)
    key = args.key[0]
    try:
        engine = Idempotent(store)
        res = engine.run(key, lambda: {"charge_id": f"ch_retry_{key}"}, payload=payload_for(key))
        doc = {"executed": res.executed, "value": res.value,
               "state": res.record.state.value if res.record else None}
    except Exception as exc:  # the library's refusal is the answer here
        doc = {"error": type(exc).__name__}
    finally:
        close_store(args.backend, store)
    return doc


def scenario_rows(args: argparse.Namespace) -> dict[str, Any]:
    if args.backend == "mysql":
        configure_django(args.dsn)
    return {"rows": rows_of(args.backend, args.dsn, args.key)}


def rows_of(backend: str, dsn: str, keys: list[str]) -> list[dict[str, Any]]:
    return [r for r in read_rows(backend, dsn) if r["key"] in set(keys)]


def child_hold(args: argparse.Namespace) -> None:
    """Internal: claim `key` with `lease` through the engine; block in the effect."""
    store = make_store(args.backend, args.dsn)
    engine = Idempotent(store, ttl_seconds=args.lease)

    def effect() -> Any:
        print("EFFECT-STARTED", flush=True)
        time.sleep(3600)  # SIGKILLed here, mid-effect
        return "never"

    engine.run(args.key, effect, payload=payload_for(args.key))
    raise SystemExit("holder was not killed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True, choices=["sqlite", "postgres", "mysql"])
    ap.add_argument("--dsn", required=True)
    sub = ap.add_subparsers(dest="scenario", required=True)
    sub.add_parser("populate")
    sub.add_parser("mutate")
    b = sub.add_parser("bulk")
    b.add_argument("--count", type=int, required=True)
    b.add_argument("--start", type=int, default=0)
    u = sub.add_parser("unknown")
    u.add_argument("--key", action="append", required=True)
    c = sub.add_parser("app-complete")
    c.add_argument("--key", action="append", required=True)
    c.add_argument("--response", required=True)
    t = sub.add_parser("retry")
    t.add_argument("--key", action="append", required=True)
    r = sub.add_parser("rows")
    r.add_argument("--key", action="append", required=True)
    h = sub.add_parser("_hold")
    h.add_argument("--key", required=True)
    h.add_argument("--lease", type=float, required=True)
    args = ap.parse_args()

    if args.scenario == "_hold":
        child_hold(args)
        return
    try:
        doc = {"populate": scenario_populate, "mutate": scenario_mutate,
               "bulk": scenario_bulk, "unknown": scenario_unknown,
               "app-complete": scenario_app_complete,
               "rows": scenario_rows, "retry": scenario_retry}[args.scenario](args)
    except Failure as exc:
        print(f"justonce_writer: {args.scenario} on {args.backend}: {exc}", file=sys.stderr)
        raise SystemExit(2)
    json.dump(doc, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
