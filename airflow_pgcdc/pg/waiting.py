"""Drivers for the I/O generators of this package: one blocking, one asyncio.

A generator yields ``(fileno, wait, timeout)`` whenever it must wait for the socket
(``wait`` is a combination of :data:`WAIT_R` / :data:`WAIT_W`, ``timeout`` seconds or
``None``), and is sent back the readiness that happened (``READY_R`` / ``READY_W``
bits), or ``0`` when the timeout expired first. Its return value is the driver's
result. This is psycopg's generators + waiting model; the logic is written once.
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Generator
from typing import Any, TypeVar

RV = TypeVar("RV")

WAIT_R = 1
WAIT_W = 2
WAIT_RW = 3
READY_R = 1
READY_W = 2

PQGen = Generator[tuple[int, int, float | None], int, RV]

_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP


def wait_sync(gen: PQGen[RV]) -> RV:
    """Run ``gen`` to completion, blocking the thread on the socket (interruptible)."""
    try:
        fileno, wait, timeout = next(gen)
        while True:
            poller = select.poll()
            poller.register(fileno, (_POLL_IN if wait & WAIT_R else 0) | (_POLL_OUT if wait & WAIT_W else 0))
            events = poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
            ready = 0
            for _fd, ev in events:
                if ev & _POLL_IN and wait & WAIT_R:
                    ready |= READY_R
                if ev & _POLL_OUT and wait & WAIT_W:
                    ready |= READY_W
            fileno, wait, timeout = gen.send(ready)
    except StopIteration as ex:
        return ex.value


async def wait_async(gen: PQGen[RV]) -> RV:
    """Run ``gen`` to completion on the running asyncio loop."""
    loop = asyncio.get_running_loop()
    try:
        fileno, wait, timeout = next(gen)
        while True:
            fut: asyncio.Future[int] = loop.create_future()

            def wake(flag: int, fut: asyncio.Future[Any] = fut) -> None:
                if not fut.done():
                    fut.set_result(flag)

            if wait & WAIT_R:
                loop.add_reader(fileno, wake, READY_R)
            if wait & WAIT_W:
                loop.add_writer(fileno, wake, READY_W)
            timer = loop.call_later(timeout, wake, 0) if timeout is not None else None
            try:
                ready = await fut
            finally:
                if timer is not None:
                    timer.cancel()
                if wait & WAIT_R:
                    loop.remove_reader(fileno)
                if wait & WAIT_W:
                    loop.remove_writer(fileno)
            fileno, wait, timeout = gen.send(ready)
    except StopIteration as ex:
        return ex.value
