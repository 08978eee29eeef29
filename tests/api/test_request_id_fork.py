"""Generated request ids differ between a process and a child it forks: PSRL launches its
gateways in forked processes after importing smgrl, and two gateways must not generate the same
x-request-id sequence."""

from __future__ import annotations

import os

from smgrl.http.bodies.envelopes import new_request_id


def test_a_forked_child_generates_other_request_ids_than_its_parent():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id, then out at once (no test machinery runs here)
        try:
            os.write(write_end, new_request_id("/generate").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        child = os.read(read_end, 256).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    parent = new_request_id("/generate")
    assert child and parent and child != parent
